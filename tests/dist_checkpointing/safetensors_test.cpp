// safetensors container: layout written (header length, padding, contiguous offsets), round trip of
// every dtype, and the reader's errors on damaged headers (each must name the file and tensor).
#include "mcpp/dist_checkpointing/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "dist_checkpointing/ckpt_test_util.h"
#include "mcpp/core/error.h"

namespace mcpp::dist_checkpointing {
namespace {
using namespace testing;

// Writes a file whose header is `json` (no padding) followed by `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& json, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  s += json;
  s.append(data_bytes, '\0');
  write_text(path, s);
}

TEST(Safetensors, RoundTripLayoutAndChecksums) {
  TempDir dir;
  std::string path = dir / "a.safetensors";
  std::vector<SafetensorsItem> items = {{"w", random_tensor({3, 5}, DType::F32, 1)},
                                        {"b", random_tensor({7}, DType::BF16, 2)},
                                        {"h", random_tensor({2, 1, 3}, DType::F16, 3)},
                                        {"i", random_tensor({4}, DType::I32, 4)},
                                        {"step", random_tensor({}, DType::I64, 5)},
                                        {"empty", random_tensor({0, 4}, DType::F32, 6)}};
  auto written = write_safetensors(path, items, {{"format", "pt"}}, /*fsync_file=*/true);
  SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(h.data_start % 8, 0u) << "header padded to 8-byte alignment as safetensors does";
  EXPECT_EQ(h.metadata.at("format"), "pt");
  uint64_t total = 0;
  for (const auto& it : items) total += it.tensor.nbytes();
  EXPECT_EQ(h.file_size, h.data_start + total) << "tensors back to back, nothing after them";
  ASSERT_EQ(written.size(), items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const SafetensorsEntry* e = h.find(items[i].name);
    ASSERT_NE(e, nullptr) << items[i].name;
    EXPECT_EQ(e->shape, items[i].tensor.shape());
    EXPECT_EQ(e->dtype, items[i].tensor.dtype());
    EXPECT_EQ(h.data_start + e->begin, written[i].byte_offset);
    EXPECT_EQ(written[i].xxh3, xxh3_bytes(items[i].tensor.raw(), items[i].tensor.nbytes()));
    Tensor back = read_safetensors_tensor(h, *e);
    EXPECT_TRUE(bit_equal(back, items[i].tensor)) << items[i].name;
  }
  // offsets contiguous in write order (safetensors' own validation requires no holes)
  uint64_t expect = 0;
  for (const auto& e : h.entries) {
    EXPECT_EQ(e.begin, expect) << e.name;
    expect = e.end;
  }
}

TEST(Safetensors, Xxh3MatchesReferenceValue) {
  // XXH3-64 of "abc" as printed by python3-xxhash (xxhash.xxh3_64_hexdigest(b"abc")).
  EXPECT_EQ(xxh3_hex(xxh3_bytes("abc", 3)), "78af5f94892f3950");
}

TEST(Safetensors, RejectsDuplicateAndReservedNames) {
  TempDir dir;
  Tensor t = random_tensor({2}, DType::F32, 1);
  expect_error([&] { write_safetensors(dir / "x", {{"a", t}, {"a", t}}, {}, false); }, {"duplicate", "'a'"});
  expect_error([&] { write_safetensors(dir / "x", {{"__metadata__", t}}, {}, false); }, {"__metadata__"});
}

TEST(Safetensors, DamagedHeadersAreNamedErrors) {
  TempDir dir;
  const std::string p = dir / "bad.safetensors";
  write_text(p, "abc");
  expect_error([&] { read_safetensors_header(p); }, {p, "truncated"});
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
  EXPECT_NO_THROW(read_safetensors_header(p));
  // header length larger than the file
  std::string s = read_text(p);
  s[0] = static_cast<char>(0xff);
  write_text(p, s);
  expect_error([&] { read_safetensors_header(p); }, {p, "truncated"});
  write_raw(p, "{not json", 0);
  expect_error([&] { read_safetensors_header(p); }, {p, "not valid JSON"});
  write_raw(p, "[1, 2]", 0);
  expect_error([&] { read_safetensors_header(p); }, {p, "not a JSON object"});
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4);
  expect_error([&] { read_safetensors_header(p); }, {p, "'a'", "truncated"});
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8);
  expect_error([&] { read_safetensors_header(p); }, {p, "'a'", "needs 12"});
  write_raw(p, "{\"a\": {\"dtype\": \"Q7\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
  expect_error([&] { read_safetensors_header(p); }, {p, "'a'", "unknown dtype"});
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8);
  expect_error([&] { read_safetensors_header(p); }, {p, "'a'"});
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8);
  expect_error([&] { read_safetensors_header(p); }, {p, "'a'", "data_offsets"});
  write_raw(p,
            "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
            " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
            12);
  expect_error([&] { read_safetensors_header(p); }, {p, "overlap"});
  write_raw(p, "{\"__metadata__\": {\"x\": 3}}", 0);
  expect_error([&] { read_safetensors_header(p); }, {p, "__metadata__"});
  expect_error([&] { read_safetensors_header(dir / "missing.safetensors"); }, {"missing.safetensors"});
  // an unknown-to-us but valid safetensors dtype parses, and reading it is a clean error
  write_raw(p, "{\"m\": {\"dtype\": \"BOOL\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4);
  SafetensorsHeader h = read_safetensors_header(p);
  expect_error([&] { read_safetensors_tensor(h, h.entries.at(0)); }, {p, "'m'", "BOOL"});
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
