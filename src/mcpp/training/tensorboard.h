// TensorBoard event files written without TensorFlow: Megatron's --tensorboard-dir scalars (training/
// tensorboard_log.h decides which), read by TensorBoard's own EventAccumulator (tests/device/tensorboard_check.py).
//
// File: <dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid> (TensorBoard reads every file whose name holds
// "tfevents"), a sequence of TFRecords:
//   uint64 length (little endian) | uint32 masked_crc32c(those 8 bytes) | length bytes of data |
//   uint32 masked_crc32c(data)
// with crc32c = CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF; "123456789"
// -> 0xE3069283) and masked(c) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2^32).
// Each record's data is a serialized tensorflow.Event (tensorboard/compat/proto/event.proto), hand-encoded:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first record is {wall_time, file_version: "brain.Event:2"}; each add_scalar one Event with one Value (the
// value rounded to float32, as TensorBoard stores scalars). Records are buffered by the stream and flushed at
// flush() (the trainer's log interval) and at destruction.
#pragma once
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

namespace mcpp::tensorboard {

uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);
// One TFRecord around `data` (length, its CRC, data, data's CRC).
std::string tfrecord(const std::string& data);
// Serialized Event messages (the record payloads).
std::string file_version_event(double wall_time);
std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value);

class SummaryWriter {
 public:
  SummaryWriter() = default;
  // Creates `dir` and the event file in it (writes the file_version record); mcpp::Error naming tensorboard_dir when
  // either cannot be created or written. Empty dir: disabled (every call is a no-op).
  explicit SummaryWriter(const std::string& dir);
  SummaryWriter(SummaryWriter&&) = default;
  SummaryWriter& operator=(SummaryWriter&&) = default;
  ~SummaryWriter();
  bool enabled() const { return out_.is_open(); }
  const std::string& path() const { return path_; }
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace mcpp::tensorboard
