// TensorBoard event files (training/tensorboard.h): CRC-32C against the published check values (RFC 3720 B.4 and
// the "123456789" check), the masked CRC, an Event's bytes hand-encoded from event.proto's field numbers, the TFRecord
// framing of a written file, and an unwritable directory's error. (tests/oracle/cli/observability_check.py reads a
// real run's event file with an independent CRC and decoder; tests/device/tensorboard_check.py with TensorBoard.)
#include "mcpp/training/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mcpp/core/error.h"

namespace mcpp::tensorboard {
namespace {

namespace fs = std::filesystem;

TEST(TensorBoard, Crc32cCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> b(32, 0x00);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
  std::fill(b.begin(), b.end(), 0xFF);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x62A8AB43u);  // 32 bytes of ones
  for (int i = 0; i < 32; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x46DD794Eu);  // 0x00 .. 0x1F
  // masked(c) = ((c >> 15) | (c << 17)) + 0xA282EAD8
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xA282EAD8u));
}

TEST(TensorBoard, ScalarEventBytes) {
  // Event{wall_time: 1.5, step: 7, summary{value{tag: "a", simple_value: 2.0}}}
  const std::string got = scalar_event(1.5, 7, "a", 2.0f);
  const std::vector<uint8_t> want = {
      0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F,  // field 1 (fixed64): 1.5
      0x10, 0x07,                          // field 2 (varint): 7
      0x2A, 0x0A,                          // field 5 (Summary, 10 bytes)
      0x0A, 0x08,                          //   field 1 (Value, 8 bytes)
      0x0A, 0x01, 'a',                     //     tag = "a"
      0x15, 0, 0, 0, 0x40};                //     field 2 (fixed32): 2.0f
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), want);
  const std::string v = file_version_event(0.0);  // wall_time 0, file_version "brain.Event:2"
  EXPECT_EQ(v.substr(9, 2), std::string("\x1A\x0D", 2));
  EXPECT_EQ(v.substr(11), "brain.Event:2");
}

TEST(TensorBoard, WriterFramesEveryRecord) {
  const fs::path dir = fs::temp_directory_path() / ("mcpp_tb_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string path;
  {
    SummaryWriter w(dir.string());
    ASSERT_TRUE(w.enabled());
    path = w.path();
    w.add_scalar("lm loss", 3.25, 1);
    w.add_scalar("lm loss", 3.0, 2);
  }
  EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  std::ifstream f(path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t at = 0;
  std::vector<std::string> records;
  while (at < all.size()) {
    ASSERT_LE(at + 12, all.size());
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, all.data() + at, 8);
    std::memcpy(&len_crc, all.data() + at + 8, 4);
    EXPECT_EQ(len_crc, masked_crc32c(all.data() + at, 8));
    ASSERT_LE(at + 12 + len + 4, all.size());
    const std::string data = all.substr(at + 12, len);
    std::memcpy(&data_crc, all.data() + at + 12 + len, 4);
    EXPECT_EQ(data_crc, masked_crc32c(data.data(), data.size()));
    records.push_back(data);
    at += 12 + len + 4;
  }
  ASSERT_EQ(records.size(), 3u);  // file_version, then the two scalars
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_EQ(records[2].substr(9), scalar_event(0.0, 2, "lm loss", 3.0f).substr(9));  // all but the wall time
  fs::remove_all(dir);
}

TEST(TensorBoard, UnwritableDirectoryNamesTheField) {
  try {
    SummaryWriter w("/proc/self/status/tb");  // under a file: cannot be created
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensorboard_dir"), std::string::npos) << e.what();
  }
  SummaryWriter off("");
  EXPECT_FALSE(off.enabled());
  off.add_scalar("x", 1.0, 1);  // a no-op
}

}  // namespace
}  // namespace mcpp::tensorboard
