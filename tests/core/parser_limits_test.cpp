// Every parser a file can reach (issue 38): a 100,000-deep JSON / TOML is one named error, never a stack
// overflow; a FIFO, a directory or a device in place of a file is refused by name at once, never waited on.
// Parsers: core/json_limits itself, the safetensors header, HF config.json, the GPT-2 vocab (and merges) files,
// a trace file, the TOML recipe (dotted keys: toml++ alone crashes on them), the indexed dataset .idx / .bin.
// (The manifest's own cases: tests/dist_checkpointing/manifest_checksum_test.cpp.)
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "dist_checkpointing/ckpt_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/core/regular_file.h"
#include "mcpp/core/toml_limits.h"
#include "mcpp/datasets/gpt2_tokenizer.h"
#include "mcpp/datasets/indexed_dataset.h"
#include "mcpp/dist_checkpointing/hf_convert.h"
#include "mcpp/dist_checkpointing/safetensors.h"
#include "mcpp/tools/trace_summary.h"
#include "mcpp/training/arguments.h"

namespace fs = std::filesystem;

namespace mcpp {
namespace {
using dist_checkpointing::testing::expect_error;
using dist_checkpointing::testing::TempDir;
using dist_checkpointing::testing::write_text;

const std::string kDeepArray = std::string(100000, '[') + std::string(100000, ']');

// A FIFO (and a directory) at `path` makes `fn` throw naming the path and the kind, within a second.
void expect_refuses_special_files(const std::string& path, const std::function<void()>& fn) {
  fs::remove_all(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path;
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(fn, {path, "FIFO"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));  // refused, not waited on
  fs::remove(path);
  fs::create_directory(path);
  expect_error(fn, {path, "directory"});
  fs::remove(path);
}

TEST(ParserLimits, JsonDepthAndSize) {
  expect_error([] { parse_json_limited(kDeepArray, "x.json"); }, {"x.json", "nests deeper than 64 levels", "byte 64"});
  expect_error([] { parse_json_limited("{\"a\": [1, 2", "y.json"); }, {"y.json", "not valid JSON"});
  // A number past double's range is nlohmann's out_of_range.406, not a parse_error (found by the manifest fuzzer).
  expect_error([] { parse_json_limited("{\"a\": 4e99999}", "z.json"); }, {"z.json", "not valid JSON", "number overflow"});
  expect_error([] { parse_json_limited("[1, 2, 3]", "z.json", {.max_bytes = 4}); }, {"z.json", "more than the 4"});
  EXPECT_EQ(parse_json_limited(std::string(64, '[') + std::string(64, ']'), "ok").dump().size(), 128u);
  TempDir dir;
  expect_refuses_special_files(dir / "f.json", [&] { read_json_file(dir / "f.json", "test file"); });
  expect_error([] { open_regular_file("/dev/null", "device"); }, {"/dev/null", "character device"});
}

TEST(ParserLimits, SafetensorsHeader) {
  TempDir dir;
  const std::string p = dir / "deep.safetensors";
  const std::string header = "{\"a\": " + kDeepArray + "}";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  write_text(p, bytes + header);
  expect_error([&] { dist_checkpointing::read_safetensors_header(p); }, {p, "nests deeper than 64 levels"});
  expect_refuses_special_files(p, [&] { dist_checkpointing::read_safetensors_header(p); });
}

TEST(ParserLimits, HfConfigJson) {
  TempDir dir;
  write_text(dir / "config.json", "{\"model_type\": \"llama\", \"x\": " + kDeepArray + "}");
  expect_error([&] { dist_checkpointing::import_hf(dir.path(), dist_checkpointing::HfFormat::Llama); },
               {"config.json", "nests deeper than 64 levels"});
  // A wrong type is named by its field, not nlohmann's "type must be string, but is number".
  write_text(dir / "config.json", "{\"model_type\": \"gpt2\", \"activation_function\": 7}");
  expect_error([&] { dist_checkpointing::import_hf(dir.path(), dist_checkpointing::HfFormat::Gpt2); },
               {"config.json", "activation_function", "must be a string"});
  expect_refuses_special_files(dir / "config.json",
                               [&] { dist_checkpointing::import_hf(dir.path(), dist_checkpointing::HfFormat::Llama); });
}

TEST(ParserLimits, TokenizerFiles) {
  TempDir dir;
  write_text(dir / "vocab.json", "{\"a\": " + kDeepArray + "}");
  write_text(dir / "merges.txt", "#version: 0.2\na b\n");
  expect_error([&] { GPT2Tokenizer::from_files(dir / "vocab.json", dir / "merges.txt"); },
               {"vocab.json", "nests deeper than 64 levels"});
  expect_refuses_special_files(dir / "vocab.json",
                               [&] { GPT2Tokenizer::from_files(dir / "vocab.json", dir / "merges.txt"); });
  write_text(dir / "vocab.json", "{\"a\": 0, \"<|endoftext|>\": 1}");
  expect_refuses_special_files(dir / "merges.txt",
                               [&] { GPT2Tokenizer::from_files(dir / "vocab.json", dir / "merges.txt"); });
}

TEST(ParserLimits, TraceFile) {
  TempDir dir;
  write_text(dir / "trace.json", "{\"traceEvents\": " + kDeepArray + "}");
  expect_error([&] { tools::read_trace(dir / "trace.json"); }, {"trace.json", "nests deeper than 64 levels"});
  expect_refuses_special_files(dir / "trace.json", [&] { tools::read_trace(dir / "trace.json"); });
}

TEST(ParserLimits, TomlRecipe) {
  TempDir dir;
  std::string dotted = "a";
  for (int i = 0; i < 100000; ++i) dotted += ".b";
  for (const std::string& text : {dotted + " = 1\n", "[" + dotted + "]\nx = 1\n", "x = {" + dotted + " = 1}\n"}) {
    write_text(dir / "deep.toml", text);
    Config cfg;
    expect_error([&] { load_toml_config(dir / "deep.toml", cfg); }, {"deep.toml:1", "more than 64 components"});
  }
  write_text(dir / "deep.toml", "x = " + std::string(100000, '[') + std::string(100000, ']') + "\n");
  Config cfg;
  expect_error([&] { load_toml_config(dir / "deep.toml", cfg); }, {"deep.toml", "nested value depth"});
  // Dots inside strings, comments and numbers are not key components.
  EXPECT_EQ(toml_key_depth_error("a.b = \"" + std::string(200, '.') + "\" # " + std::string(200, '.') +
                                     "\nx = [1.5, 2.5e+3, 3.25]\ns = '''\n" + dotted + "\n'''\n",
                                 64),
            std::string_view::npos);
  expect_refuses_special_files(dir / "r.toml", [&] { load_toml_config(dir / "r.toml", cfg); });
}

TEST(ParserLimits, IndexedDatasetFiles) {
  TempDir dir;
  {
    IndexedDatasetBuilder b(dir / "d.bin", IndexedDType::U16);
    const std::vector<int32_t> tokens{1, 2, 3};
    b.add_item(std::span<const int32_t>(tokens));
    b.end_document();
    b.finalize(dir / "d.idx");
  }
  EXPECT_NO_THROW(IndexedDataset::open(dir / "d"));
  fs::rename(dir / "d.idx", dir / "keep.idx");
  expect_refuses_special_files(dir / "d.idx", [&] { IndexedDataset::open(dir / "d"); });
  fs::rename(dir / "keep.idx", dir / "d.idx");
  expect_refuses_special_files(dir / "d.bin", [&] { IndexedDataset::open(dir / "d"); });
}

}  // namespace
}  // namespace mcpp
