// TensorBoard event files: TFRecord framing with masked CRC-32C and hand-encoded Event protos (tensorboard.h).
#include "mcpp/training/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "mcpp/core/error.h"

namespace mcpp::tensorboard {
namespace {

// Byte-at-a-time table of the reflected Castagnoli polynomial.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

// Protocol-buffer wire encoding: a varint, a field key (number << 3 | wire type), little-endian fixed widths.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
void key(std::string& out, uint32_t field, Wire w) { varint(out, (static_cast<uint64_t>(field) << 3) | w); }
template <class T> void fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little endian (x86-64)
  out.append(b, sizeof(T));
}
void bytes_field(std::string& out, uint32_t field, const std::string& s) {
  key(out, field, kLengthDelimited);
  varint(out, s.size());
  out += s;
}
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, kFixed64);  // wall_time
  fixed(e, wall_time);
  if (step != 0) {  // proto3: a zero step is absent
    key(e, 2, kVarint);
    varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string tfrecord(const std::string& data) {
  std::string r;
  fixed(r, static_cast<uint64_t>(data.size()));
  fixed(r, masked_crc32c(r.data(), 8));
  r += data;
  fixed(r, masked_crc32c(data.data(), data.size()));
  return r;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  bytes_field(e, 3, "brain.Event:2");
  return e;
}

std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;  // Summary.Value
  bytes_field(v, 1, tag);
  key(v, 2, kFixed32);  // simple_value
  fixed(v, value);
  std::string summary;
  bytes_field(summary, 1, v);
  std::string e = event_head(wall_time, step);
  bytes_field(e, 5, summary);
  return e;
}

SummaryWriter::SummaryWriter(const std::string& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("tensorboard_dir: cannot create '{}': {}", dir, ec.message());
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) std::strcpy(host.data(), "localhost");
  const double t = now_seconds();
  path_ = (std::filesystem::path(dir) /
           fmt::format("events.out.tfevents.{}.{}.{}", static_cast<int64_t>(t), host.data(), ::getpid()))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) fail("tensorboard_dir: cannot write an event file in '{}'", dir);
  out_ << tfrecord(file_version_event(t));
  out_.flush();
  if (!out_) fail("tensorboard_dir: cannot write to '{}'", path_);
}

SummaryWriter::~SummaryWriter() {
  if (out_.is_open()) out_.flush();
}

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  if (!out_.is_open()) return;
  out_ << tfrecord(scalar_event(now_seconds(), step, tag, static_cast<float>(value)));
}

void SummaryWriter::flush() {
  if (out_.is_open()) out_.flush();
}

}  // namespace mcpp::tensorboard
