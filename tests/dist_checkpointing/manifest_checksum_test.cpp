// The manifest checksum and the reader's integrity checks (issue 38): an edited meta field is refused naming the
// field; an older (version 2) manifest without a checksum still loads; aliased and swapped entries, a deep
// `meta`, FIFOs in place of the manifest / tracker / data file, and a manifest claiming a tensor no disk holds
// are named errors, never a crash, a hang or wrong bytes.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "dist_checkpointing/ckpt_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/manifest.h"
#include "mcpp/dist_checkpointing/safetensors.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
namespace {
using namespace testing;

class ManifestIntegrity : public ::testing::Test {
 protected:
  void SetUp() override {
    CheckpointContents c;
    c.iteration = 40;
    c.meta = {{"iteration", 40},
              {"consumed_train_samples", 320},
              {"optimizer", {{"step", 40}}},
              {"opt_param_scheduler", {{"num_steps", 320}, {"max_lr", 3e-4}}}};
    c.tensors = {{"a", random_tensor({4, 8}, DType::F32, 1)},
                 {"b", random_tensor({4, 8}, DType::F32, 2)},
                 {"optimizer.exp_avg.a", random_tensor({4, 8}, DType::F32, 3)}};
    contents_ = c;
    iter_dir_ = save_checkpoint(dir_.path(), c);
    manifest_ = iter_dir_ + "/manifest.json";
  }
  void reset() {  // a fresh checkpoint in the same directory
    fs::remove_all(dir_.path());
    fs::create_directories(dir_.path());
    SetUp();
  }
  nlohmann::json manifest() const { return nlohmann::json::parse(read_text(manifest_)); }
  // Edits the manifest; `reseal` recomputes the checksum (a consistent but wrong manifest, as a buggy saver).
  void edit(const std::function<void(nlohmann::json&)>& fn, bool reseal) {
    nlohmann::json j = manifest();
    fn(j);
    if (reseal) seal_manifest(j);
    write_text(manifest_, reseal ? manifest_text(j) : j.dump(1));
  }
  void read_all() const {
    CheckpointReader r(dir_.path());
    for (const auto& nt : contents_.tensors) r.read(nt.key);
  }
  TempDir dir_;
  CheckpointContents contents_;
  std::string iter_dir_, manifest_;
};

TEST_F(ManifestIntegrity, WrittenLastAsVersionThreeAndReadBack) {
  const std::string text = read_text(manifest_);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["format_version"], kManifestFormatVersion);
  EXPECT_EQ(kManifestFormatVersion, 3);
  // The checksum fields are the file's last two.
  EXPECT_GT(text.rfind("\"manifest_xxh3\""), text.rfind("\"manifest_field_xxh3\""));
  EXPECT_GT(text.rfind("\"manifest_field_xxh3\""), text.rfind("\"tensors\""));
  EXPECT_TRUE(j["manifest_field_xxh3"].contains("meta.consumed_train_samples"));
  EXPECT_TRUE(j["manifest_field_xxh3"].contains("meta.optimizer.step"));
  EXPECT_TRUE(j["manifest_field_xxh3"].contains("tensors[a@0,0]"));
  // The checksum covers values, not whitespace: a re-indented manifest still loads.
  write_text(manifest_, j.dump(4));
  EXPECT_NO_THROW(read_all());
}

TEST_F(ManifestIntegrity, EditedMetaFieldsAreNamed) {
  edit([](nlohmann::json& j) { j["meta"]["consumed_train_samples"] = 321; }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {manifest_, "checksum mismatch", "meta.consumed_train_samples"});
  reset();
  edit([](nlohmann::json& j) { j["meta"]["optimizer"]["step"] = 41; }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {manifest_, "checksum mismatch", "meta.optimizer.step"});
  reset();
  edit([](nlohmann::json& j) { j["iteration"] = 41; }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {"checksum mismatch", "iteration"});
  reset();
  edit([](nlohmann::json& j) { j["meta"]["new_field"] = 1; }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {"checksum mismatch", "meta.new_field (added)"});
  reset();
  edit([](nlohmann::json& j) { j["tensors"].erase(1); }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {"checksum mismatch", "tensors[b@0,0] (removed)"});
  reset();
  edit([](nlohmann::json& j) { j["manifest_field_xxh3"]["iteration"] = "0000000000000000"; }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {"checksum mismatch", "iteration"});
  reset();  // the field map re-hashed but the whole-manifest checksum left: the checksum fields themselves
  edit([](nlohmann::json& j) { j["manifest_field_xxh3"]["extra"] = "0000000000000000"; }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {"checksum mismatch", "extra (removed)"});
  reset();
  edit([](nlohmann::json& j) { j["manifest_xxh3"] = "0000000000000000"; }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {"checksum mismatch", "manifest_xxh3"});
  reset();
  edit([](nlohmann::json& j) { j.erase("manifest_xxh3"); }, false);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {"format_version 3 requires", "manifest_xxh3"});
}

TEST_F(ManifestIntegrity, VersionTwoWithoutChecksumStillLoads) {
  edit([](nlohmann::json& j) {
    j.erase("manifest_xxh3");
    j.erase("manifest_field_xxh3");
    j["format_version"] = 2;
  }, false);
  CheckpointReader r(dir_.path());
  EXPECT_EQ(r.manifest().format_version, 2);
  for (const auto& nt : contents_.tensors) EXPECT_TRUE(bit_equal(r.read(nt.key), nt.tensor)) << nt.key;
}

TEST_F(ManifestIntegrity, AliasedAndSwappedEntriesAreRefused) {
  // Two keys pointing at the same bytes (same shape, checksum consistent): refused by the parser.
  edit([](nlohmann::json& j) {
    j["tensors"][1]["byte_offset"] = j["tensors"][0]["byte_offset"];
    j["tensors"][1]["xxh3"] = j["tensors"][0]["xxh3"];
  }, true);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {manifest_, "'a'", "'b'", "alias the same bytes"});
  // Two entries swapped in the manifest (each other's offset and checksum): the file's header disagrees.
  reset();
  edit([](nlohmann::json& j) {
    std::swap(j["tensors"][0]["byte_offset"], j["tensors"][1]["byte_offset"]);
    std::swap(j["tensors"][0]["xxh3"], j["tensors"][1]["xxh3"]);
  }, true);
  expect_error([&] { read_all(); }, {"model.safetensors", "header entry", "disagrees with the manifest"});
  // The same swap in the safetensors header instead (the manifest untouched).
  reset();
  const std::string model = iter_dir_ + "/model.safetensors";
  std::string bytes = read_text(model);
  const size_t a = bytes.find("\"a\":"), b = bytes.find("\"b\":");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  bytes[a + 1] = 'b';
  bytes[b + 1] = 'a';  // "a" and "b" trade names: same shapes, each other's bytes
  write_text(model, bytes);
  expect_error([&] { read_all(); }, {model, "header entry", "disagrees with the manifest"});
  CheckpointReader r(dir_.path());
  expect_error([&] { r.verify("a"); }, {model, "'a'", "disagrees"});
}

TEST_F(ManifestIntegrity, DeepMetaIsOneErrorNotACrash) {
  std::string deep = read_text(manifest_);
  const size_t at = deep.find("\"meta\": {") + 9;
  deep.insert(at, "\"deep\": " + std::string(100000, '[') + std::string(100000, ']') + ",");
  write_text(manifest_, deep);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {manifest_, "nests deeper than 64 levels"});
  EXPECT_THROW(parse_json_limited(std::string(100000, '{'), "x"), Error);
  EXPECT_EQ(json_depth_error("[\"[[[[\\\"[\", {\"a\": [1]}]", 3), std::string_view::npos);  // brackets in strings
  EXPECT_EQ(json_depth_error("[[[1]]]", 2), 2u);
}

TEST_F(ManifestIntegrity, FifosAreRefusedNotWaitedOn) {
  const auto t0 = std::chrono::steady_clock::now();
  fs::remove(manifest_);
  ASSERT_EQ(::mkfifo(manifest_.c_str(), 0644), 0);
  expect_error([&] { CheckpointReader r(dir_.path()); }, {manifest_, "FIFO", "not a regular file"});
  const std::string tracker = dir_ / "latest_checkpointed_iteration.txt";
  fs::remove(tracker);
  ASSERT_EQ(::mkfifo(tracker.c_str(), 0644), 0);
  expect_error([&] { latest_iteration(dir_.path()); }, {tracker, "FIFO"});
  reset();
  const std::string model = iter_dir_ + "/model.safetensors";
  fs::remove(model);
  ASSERT_EQ(::mkfifo(model.c_str(), 0644), 0);
  expect_error([&] { read_all(); }, {model, "FIFO"});
  fs::remove(model);
  fs::create_directory(model);
  expect_error([&] { read_all(); }, {model, "directory"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));  // nothing blocked
}

TEST_F(ManifestIntegrity, HugeTensorClaimIsNamedNotBadAlloc) {
  // A consistent manifest claiming 2^40 elements for 'a' (in a file of its own): the file's header does not hold
  // them, which is found before anything is allocated.
  fs::copy_file(iter_dir_ + "/model.safetensors", iter_dir_ + "/big.safetensors");
  edit([](nlohmann::json& j) {
    j["tensors"][0]["file"] = "big.safetensors";
    j["tensors"][0]["global_shape"] = {uint64_t{1} << 20, uint64_t{1} << 20};
    j["tensors"][0]["local_shape"] = {uint64_t{1} << 20, uint64_t{1} << 20};
    j["tensors"][0]["byte_length"] = uint64_t{4} << 40;
  }, true);
  CheckpointReader r(dir_.path());
  expect_error([&] { r.read("a"); }, {"big.safetensors", "'a'", "disagrees"});
  expect_error([&] { r.verify("a"); }, {"big.safetensors", "'a'", "disagrees"});
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
