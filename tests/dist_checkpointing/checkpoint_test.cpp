// Single-process checkpoint: bit-identical save/load round trip (tensors + meta), atomic commit
// behaviour (no overwrite, staging dirs ignored, tracker), and every corruption case as an mcpp::Error
// naming the file and the tensor; a randomized damage loop checks that nothing crashes or reads wrong
// bytes silently.
#include "mcpp/dist_checkpointing/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "dist_checkpointing/ckpt_test_util.h"
#include "mcpp/core/error.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
namespace {
using namespace testing;

CheckpointContents sample(int64_t iteration) {
  CheckpointContents c;
  c.iteration = iteration;
  c.meta = {{"config", {{"model", {{"num_layers", 2}, {"hidden_size", 8}}}}},
            {"fingerprint", "0123456789abcdef"},
            {"scheduler", {{"num_steps", 800}, {"lr", 1.5e-4}}},
            {"rng", {{"seed", 1234}, {"offset", 99}}}};
  const std::string p = "decoder.layers.0.self_attention.linear_qkv.weight";
  c.tensors = {{"embedding.word_embeddings.weight", random_tensor({16, 8}, DType::F32, 1)},
               {p, random_tensor({24, 8}, DType::BF16, 2)},
               {"decoder.final_layernorm.weight", random_tensor({8}, DType::F32, 3)},
               {"optimizer.step", random_tensor({}, DType::I64, 4)},
               {"optimizer.exp_avg." + p, random_tensor({24, 8}, DType::F32, 5)},
               {"optimizer.exp_avg_sq." + p, random_tensor({24, 8}, DType::F32, 6)},
               {"empty", random_tensor({0, 3}, DType::F32, 7)}};
  return c;
}

void expect_same_as_saved(const CheckpointReader& r, const CheckpointContents& c) {
  EXPECT_EQ(r.iteration(), c.iteration);
  EXPECT_EQ(r.meta(), c.meta);
  ASSERT_EQ(r.manifest().tensors.size(), c.tensors.size());
  for (const auto& nt : c.tensors) {
    Tensor dst = Tensor::empty(nt.tensor.shape(), nt.tensor.dtype());
    r.read_into(nt.key, dst);
    EXPECT_TRUE(bit_equal(dst, nt.tensor)) << nt.key;
    EXPECT_TRUE(bit_equal(r.read(nt.key), nt.tensor)) << nt.key;
    EXPECT_NO_THROW(r.verify(nt.key)) << nt.key;
  }
}

TEST(Checkpoint, SaveLoadRoundTripIsBitIdentical) {
  TempDir dir;
  CheckpointContents c = sample(100);
  std::string committed = save_checkpoint(dir.path(), c);
  EXPECT_EQ(committed, dir / "iter_0000100");
  EXPECT_EQ(iteration_dir_name(7), "iter_0000007");
  EXPECT_EQ(latest_iteration(dir.path()), 100);
  EXPECT_EQ(read_text(dir / "latest_checkpointed_iteration.txt"), "100\n");
  EXPECT_TRUE(fs::exists(dir / "iter_0000100/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "iter_0000100/optimizer.safetensors"));
  CheckpointReader by_save_dir(dir.path());
  EXPECT_EQ(by_save_dir.dir(), dir / "iter_0000100");
  expect_same_as_saved(by_save_dir, c);
  expect_same_as_saved(CheckpointReader(committed), c);
  const ManifestEntry& e = by_save_dir.entry("optimizer.exp_avg.decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(e.file, "optimizer.safetensors");
  EXPECT_EQ(e.global_offset, (Shape{0, 0}));
  EXPECT_EQ(e.local_shape, e.global_shape);
  // No staging directory or tmp file is left behind.
  for (const auto& de : fs::recursive_directory_iterator(dir.path()))
    EXPECT_EQ(de.path().string().find(".tmp-"), std::string::npos) << de.path();
}

TEST(Checkpoint, RefusesToOverwriteAndTracksLatest) {
  TempDir dir;
  save_checkpoint(dir.path(), sample(100));
  expect_error([&] { save_checkpoint(dir.path(), sample(100)); }, {"refusing to overwrite", "iter_0000100"});
  EXPECT_EQ(latest_iteration(dir.path()), 100);
  save_checkpoint(dir.path(), sample(200));
  EXPECT_EQ(latest_iteration(dir.path()), 200);
  EXPECT_EQ(list_iterations(dir.path()), (std::vector<int64_t>{100, 200}));
  EXPECT_EQ(CheckpointReader(dir.path(), 100).iteration(), 100);
  EXPECT_EQ(CheckpointReader(dir.path()).iteration(), 200);
}

TEST(Checkpoint, LeftoverStagingDirIsIgnored) {
  TempDir dir;
  CheckpointContents c = sample(200);
  save_checkpoint(dir.path(), c);
  // A crash during a later save leaves a staging dir with data but no manifest, and a tracker tmp.
  fs::create_directories(dir / "iter_0000300.tmp-deadbeef");
  write_text(dir / "iter_0000300.tmp-deadbeef/model.safetensors", "partial");
  write_text(dir / "latest_checkpointed_iteration.txt.tmp-0001", "300\n");
  EXPECT_EQ(latest_iteration(dir.path()), 200);
  EXPECT_EQ(list_iterations(dir.path()), (std::vector<int64_t>{200}));
  expect_same_as_saved(CheckpointReader(dir.path()), c);
  expect_error([&] { CheckpointReader r(dir / "iter_0000300.tmp-deadbeef"); }, {"iter_0000300.tmp-deadbeef", "uncommitted"});
  // The same iteration can still be saved after a crashed attempt.
  EXPECT_NO_THROW(save_checkpoint(dir.path(), sample(300)));
  EXPECT_EQ(latest_iteration(dir.path()), 300);
}

TEST(Checkpoint, TrackerAndDirectoryErrors) {
  TempDir dir;
  EXPECT_EQ(latest_iteration(dir.path()), -1);
  EXPECT_TRUE(list_iterations(dir / "not_created_yet").empty());
  EXPECT_EQ(latest_iteration(dir / "not_created_yet"), -1);
  expect_error([&] { CheckpointReader r(dir.path()); }, {dir.path(), "latest_checkpointed_iteration.txt"});
  write_text(dir / "latest_checkpointed_iteration.txt", "release\n");
  expect_error([&] { latest_iteration(dir.path()); }, {"latest_checkpointed_iteration.txt", "release"});
  write_text(dir / "latest_checkpointed_iteration.txt", "5\n");
  expect_error([&] { CheckpointReader r(dir.path()); }, {"iter_0000005"});
  expect_error([&] { CheckpointReader r(dir / "nowhere"); }, {"nowhere"});
}

class CorruptCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    contents_ = sample(100);
    iter_dir_ = save_checkpoint(dir_.path(), contents_);
    manifest_ = iter_dir_ + "/manifest.json";
    model_ = iter_dir_ + "/model.safetensors";
  }
  // Reads every tensor of the checkpoint into caller tensors.
  void load_all() {
    CheckpointReader r(dir_.path());
    for (const auto& nt : contents_.tensors) {
      Tensor dst = Tensor::empty(nt.tensor.shape(), nt.tensor.dtype());
      r.read_into(nt.key, dst);
    }
  }
  // Edits and re-seals the manifest (a consistent checksum, as a buggy saver would write): the checks below
  // the manifest checksum (manifest_checksum_test.cpp covers the checksum itself).
  void edit_manifest(const std::function<void(nlohmann::json&)>& fn) {
    nlohmann::json j = nlohmann::json::parse(read_text(manifest_));
    fn(j);
    seal_manifest(j);
    write_text(manifest_, j.dump());
  }
  TempDir dir_;
  CheckpointContents contents_;
  std::string iter_dir_, manifest_, model_;
  const std::string key_ = "decoder.layers.0.self_attention.linear_qkv.weight";
};

TEST_F(CorruptCheckpoint, MissingManifest) {
  fs::remove(manifest_);
  expect_error([&] { load_all(); }, {"missing manifest", manifest_});
}

TEST_F(CorruptCheckpoint, BadJson) {
  write_text(manifest_, read_text(manifest_).substr(0, 100));
  expect_error([&] { load_all(); }, {manifest_, "not valid JSON"});
  write_text(manifest_, "[1, 2]");
  expect_error([&] { load_all(); }, {manifest_, "not a JSON object"});
}

TEST_F(CorruptCheckpoint, ManifestFieldErrorsNameTheTensor) {
  edit_manifest([&](nlohmann::json& j) { j["tensors"][1].erase("xxh3"); });
  expect_error([&] { load_all(); }, {manifest_, key_, "xxh3"});
  edit_manifest([&](nlohmann::json& j) { j["tensors"][1]["xxh3"] = "zz"; });
  expect_error([&] { load_all(); }, {manifest_, key_, "xxh3"});
  edit_manifest([&](nlohmann::json& j) { j["tensors"][1]["dtype"] = "F99"; });
  expect_error([&] { load_all(); }, {manifest_, key_, "F99"});
  edit_manifest([&](nlohmann::json& j) { j["format_version"] = 7; });
  expect_error([&] { load_all(); }, {manifest_, "format_version"});
}

TEST_F(CorruptCheckpoint, MissingDataFile) {
  fs::remove(model_);
  expect_error([&] { load_all(); }, {"missing data file", model_, "embedding.word_embeddings.weight"});
}

TEST_F(CorruptCheckpoint, TruncatedFile) {
  fs::resize_file(model_, fs::file_size(model_) - 3);
  expect_error([&] { load_all(); }, {model_, "truncated", "decoder.final_layernorm.weight"});
  fs::resize_file(model_, 20);  // inside the header
  expect_error([&] { load_all(); }, {model_, "truncated"});
}

TEST_F(CorruptCheckpoint, ChecksumMismatchAfterByteFlip) {
  CheckpointReader r(dir_.path());
  const ManifestEntry& e = r.entry(key_);
  flip_byte(model_, e.byte_offset + e.byte_length / 2);
  Tensor dst = Tensor::empty(e.global_shape, e.dtype);
  expect_error([&] { CheckpointReader(dir_.path()).read_into(key_, dst); }, {model_, key_, "checksum mismatch"});
  // the other tensors of the file still read fine
  EXPECT_NO_THROW(CheckpointReader(dir_.path()).read("decoder.final_layernorm.weight"));
}

TEST_F(CorruptCheckpoint, ShapeAndDtypeMismatchVsCallerTensor) {
  CheckpointReader r(dir_.path());
  Tensor wrong_shape = Tensor::empty({8, 24}, DType::BF16);
  expect_error([&] { r.read_into(key_, wrong_shape); }, {model_, key_, "(24, 8)", "(8, 24)"});
  Tensor wrong_dtype = Tensor::empty({24, 8}, DType::F32);
  expect_error([&] { r.read_into(key_, wrong_dtype); }, {model_, key_, "bfloat16", "float32"});
  Tensor undefined;
  expect_error([&] { r.read_into(key_, undefined); }, {key_, "undefined"});
  expect_error([&] { r.read("no.such.key"); }, {"no.such.key"});
}

TEST_F(CorruptCheckpoint, ManifestOffsetsOutOfRange) {
  // The data file's header names every entry's range: a manifest range elsewhere is refused before reading.
  edit_manifest([&](nlohmann::json& j) { j["tensors"][1]["byte_offset"] = uint64_t{1} << 40; });
  expect_error([&] { load_all(); }, {model_, key_, "disagrees with the manifest"});
  edit_manifest([&](nlohmann::json& j) { j["tensors"][1]["byte_offset"] = 3; });  // inside the header
  expect_error([&] { load_all(); }, {model_, key_, "disagrees with the manifest"});
  edit_manifest([&](nlohmann::json& j) { j["tensors"][1]["byte_length"] = 10; });
  expect_error([&] { load_all(); }, {manifest_, key_, "byte_length"});
  edit_manifest([&](nlohmann::json& j) { j["tensors"][1]["file"] = "../../etc/passwd"; });
  expect_error([&] { load_all(); }, {manifest_, key_, "plain file name"});
}

TEST_F(CorruptCheckpoint, RandomDamageNeverCrashesNorReadsWrongBytes) {
  // Flip random bytes / truncate at random lengths in the manifest and the data files. Every
  // outcome must be an mcpp::Error or a load whose tensors are bit-identical to what was saved.
  const std::string pristine_model = read_text(model_), pristine_manifest = read_text(manifest_);
  std::mt19937 gen(42);
  int errors = 0;
  for (int trial = 0; trial < 200; ++trial) {
    write_text(model_, pristine_model);
    write_text(manifest_, pristine_manifest);
    const std::string& target = trial % 2 ? model_ : manifest_;
    const size_t size = (trial % 2 ? pristine_model : pristine_manifest).size();
    if (trial % 5 == 0) fs::resize_file(target, gen() % size);
    else flip_byte(target, gen() % size);
    try {
      CheckpointReader r(dir_.path());
      for (const auto& nt : contents_.tensors) {
        Tensor dst = Tensor::empty(nt.tensor.shape(), nt.tensor.dtype());
        r.read_into(nt.key, dst);
        ASSERT_TRUE(bit_equal(dst, nt.tensor)) << "trial " << trial << " read wrong bytes of " << nt.key;
      }
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 100) << "most random damage must be detected";
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
