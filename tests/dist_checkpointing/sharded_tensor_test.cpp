// Sharded checkpoint geometry and the load planner (sharded_tensor.h, sharded_save.h, CheckpointReader::
// read_region): flat ranges as rects vs brute force, TP segments vs copy_shard_to_global, a sharded save
// (1-rank world, odd shard layouts) read back at arbitrary regions bit-identically, coverage / overlap
// / dtype errors naming key and files, checksum scope, read amplification with checksums off, and the
// refusal to load staging directories.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/sharded_save.h"
#include "mcpp/dist_checkpointing/sharded_tensor.h"
#include "tests/dist_checkpointing/ckpt_test_util.h"

namespace mcpp::dist_checkpointing {
namespace {

using testing::bit_equal;
using testing::random_tensor;
using testing::TempDir;

// Visits every index of rect r (row-major) and calls f(flat index in `shape`).
template <typename F>
void for_each_in(const Shape& shape, const Rect& r, F f) {
  const size_t nd = shape.size();
  std::vector<int64_t> idx(nd, 0);
  for (int64_t n = 0; n < r.numel(); ++n) {
    int64_t flat = 0, rem = n;
    for (size_t d = nd; d-- > 0;) {
      idx[d] = rem % r.shape[d];
      rem /= r.shape[d];
    }
    for (size_t d = 0; d < nd; ++d) flat = flat * shape[d] + r.offset[d] + idx[d];
    f(flat);
  }
}

TEST(ShardedTensor, FlatRangeRectsCoverExactlyTheRange) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t nd = 1 + gen() % 4;
    Shape shape;
    for (size_t d = 0; d < nd; ++d) shape.push_back(1 + gen() % 5);
    const int64_t n = shape_numel(shape);
    int64_t b = gen() % (n + 1), e = gen() % (n + 1);
    if (b > e) std::swap(b, e);
    std::vector<int> hits(n, 0);
    auto rects = flat_range_rects(shape, b, e);
    EXPECT_LE(rects.size(), 2 * nd - 1) << shape_str(shape) << " [" << b << "," << e << ")";
    for (const Rect& r : rects) for_each_in(shape, r, [&](int64_t i) { ++hits[i]; });
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[i], (i >= b && i < e) ? 1 : 0) << shape_str(shape) << " [" << b << "," << e << ") at " << i;
  }
}

TEST(ShardedTensor, TpSegmentsPlaceLikeCopyShardToGlobal) {
  // SwiGLU fc1 at TP2, rank 1: global [8, 3] = [gate 4 rows; up 4 rows]; rank 1 holds gate rows 2..3 and
  // up rows 6..7 as local rows 0..1 and 2..3.
  TensorShard shard{.partition_dim = 0, .global_shape = {8, 3}, .segments = {{2, 0, 2}, {6, 2, 2}}};
  Tensor local = random_tensor({4, 3}, DType::F32, 1);
  Tensor want = Tensor::zeros({8, 3});
  copy_shard_to_global(want, local, shard);
  Tensor got = Tensor::zeros({8, 3});
  auto rects = tp_shard_rects({4, 3}, shard);
  ASSERT_EQ(rects.size(), 2u);
  for (const auto& lg : rects) {
    Tensor part = extract_rect(local, lg.local);
    copy_rect(got.raw(), {8, 3}, lg.global.offset, part.raw(), part.shape(), {0, 0}, part.shape(), 4);
  }
  EXPECT_TRUE(bit_equal(got, want));
  // A flat piece crossing the segment boundary (local elements 4..8) splits into global rects.
  std::vector<int> hits(24, 0);
  for (const Rect& r : flat_range_rects({4, 3}, 4, 9))
    for (const auto& lg : local_rect_to_global(r, {4, 3}, shard))
      for_each_in({8, 3}, lg.global, [&](int64_t i) { ++hits[i]; });
  // local flat 4..8 = local row 1 cols 1..2 (global row 3), local row 2 (global row 6)
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(hits[i], (i == 10 || i == 11 || (i >= 18 && i < 21)) ? 1 : 0) << i;
}

// Saves `t` as the given rects (one rank) and returns the committed directory.
std::string save_as(const std::string& dir, int64_t it, const Tensor& t, const std::vector<Rect>& rects) {
  std::vector<ShardedTensor> shards;
  for (const Rect& r : rects) shards.push_back({"w", t.shape(), r, extract_rect(t, r)});
  auto world = comm::make_local_world();
  return save_sharded_checkpoint(dir, it, {{"note", "test"}}, shards, *world);
}

TEST(ShardedTensor, SavedShardsReadBackAtAnyRegion) {
  TempDir tmp;
  Tensor t = random_tensor({6, 5, 4}, DType::F32, 3);
  // Odd layout: a block, two flat pieces of the rest (as a distributed optimizer would cut them).
  std::vector<Rect> rects = {{{0, 0, 0}, {2, 5, 4}}};
  for (const Rect& r : flat_range_rects({6, 5, 4}, 40, 77)) rects.push_back(r);
  for (const Rect& r : flat_range_rects({6, 5, 4}, 77, 120)) rects.push_back(r);
  std::string dir = save_as(tmp.path(), 1, t, rects);
  EXPECT_EQ(latest_iteration(tmp.path()), 1);
  CheckpointReader reader(tmp.path());
  EXPECT_EQ(reader.entries("w").size(), rects.size());
  EXPECT_TRUE(bit_equal(reader.read("w"), t));
  std::mt19937 gen(5);
  for (int trial = 0; trial < 50; ++trial) {
    Rect r{Shape(3), Shape(3)};
    for (int d = 0; d < 3; ++d) {
      r.offset[d] = gen() % t.shape()[d];
      r.shape[d] = 1 + gen() % (t.shape()[d] - r.offset[d]);
    }
    Tensor got = Tensor::empty(r.shape);
    reader.read_region("w", r.offset, got);
    ASSERT_TRUE(bit_equal(got, extract_rect(t, r))) << shape_str(r.offset) << " " << shape_str(r.shape);
  }
  for (const auto& e : reader.manifest().tensors) EXPECT_NO_THROW(reader.verify("w")) << e.file;
}

TEST(ShardedTensor, ChecksumsOffReadOnlyTheNeededSpan) {
  TempDir tmp;
  Tensor t = random_tensor({64, 16}, DType::F32, 4);
  save_as(tmp.path(), 1, t, {{{0, 0}, {32, 16}}, {{32, 0}, {32, 16}}});
  CheckpointReader on(tmp.path()), off(tmp.path());
  off.set_verify_checksums(false);
  Tensor a = Tensor::empty({2, 16}), b = Tensor::empty({2, 16});
  on.read_region("w", {40, 0}, a);
  off.read_region("w", {40, 0}, b);
  EXPECT_TRUE(bit_equal(a, b));
  EXPECT_EQ(on.bytes_read(), 32u * 16 * 4);  // the whole intersecting shard: its xxh3 covers all of it
  EXPECT_EQ(off.bytes_read(), 2u * 16 * 4);  // just the two rows
}

TEST(ShardedTensor, DamagedShardIsNamedAndOnlyItsReadersFail) {
  TempDir tmp;
  Tensor t = random_tensor({8, 4}, DType::F32, 6);
  std::string dir = save_as(tmp.path(), 1, t, {{{0, 0}, {4, 4}}, {{4, 0}, {4, 4}}});
  CheckpointReader reader(dir);
  const ManifestEntry* second = reader.entries("w")[1];
  testing::flip_byte(dir + "/" + second->file, second->byte_offset + 3);
  Tensor top = Tensor::empty({4, 4});
  EXPECT_NO_THROW(reader.read_region("w", {0, 0}, top));
  try {
    reader.read("w");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(second->file), std::string::npos) << e.what();
  }
}

// Rewrites the manifest through `edit`, re-sealed (the layout checks below the manifest checksum), and returns
// the error text of opening the checkpoint.
std::string error_after_edit(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/manifest.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  edit(j);
  seal_manifest(j);
  std::ofstream(path, std::ios::trunc) << j.dump(1);
  try {
    CheckpointReader r(dir);
    r.read("w");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShardedTensor, ManifestLayoutErrorsNameKeyAndFiles) {
  Tensor t = random_tensor({8, 4}, DType::F32, 8);
  auto fresh = [&](TempDir& tmp) { return save_as(tmp.path(), 1, t, {{{0, 0}, {4, 4}}, {{4, 0}, {4, 4}}}); };
  {
    TempDir tmp;
    std::string e = error_after_edit(fresh(tmp), [](auto& j) { j["tensors"][1]["global_offset"] = {3, 0}; });
    EXPECT_NE(e.find("shards overlap"), std::string::npos) << e;
    EXPECT_NE(e.find("'w'"), std::string::npos) << e;
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  }
  {
    TempDir tmp;
    std::string e = error_after_edit(fresh(tmp), [](auto& j) { j["tensors"].erase(1); });
    EXPECT_NE(e.find("missing shards"), std::string::npos) << e;
  }
  {
    TempDir tmp;
    std::string e = error_after_edit(fresh(tmp), [](auto& j) { j["tensors"][1]["global_shape"] = {9, 4}; });
    EXPECT_NE(e.find("tensor 'w'"), std::string::npos) << e;
  }
  {
    TempDir tmp;  // a shape edit keeping byte_length consistent: the file header disagrees
    std::string e = error_after_edit(fresh(tmp), [](auto& j) {
      j["tensors"][0]["local_shape"] = {2, 8};
      j["tensors"][0]["global_shape"] = {8, 8};
      j["tensors"][1]["global_shape"] = {8, 8};
    });
    EXPECT_FALSE(e.empty());
  }
}

TEST(ShardedTensor, FailedWriteLeavesLatestAndNoStagingDir) {
  TempDir tmp;
  Tensor t = random_tensor({4, 4}, DType::F32, 9);
  save_as(tmp.path(), 1, t, {{{0, 0}, {4, 4}}});
  std::vector<ShardedTensor> bad = {{"w", {4, 4}, {{0, 0}, {4, 4}}, Tensor::empty({2, 4})}};  // wrong data shape
  auto world = comm::make_local_world();
  EXPECT_THROW(save_sharded_checkpoint(tmp.path(), 2, {}, bad, *world), Error);
  EXPECT_EQ(latest_iteration(tmp.path()), 1);
  for (const auto& de : std::filesystem::directory_iterator(tmp.path()))
    EXPECT_EQ(de.path().filename().string().find(".tmp-"), std::string::npos) << de.path();
  // A refused save of a committed iteration changes nothing either.
  EXPECT_THROW(save_as(tmp.path(), 1, t, {{{0, 0}, {4, 4}}}), Error);
  EXPECT_EQ(latest_iteration(tmp.path()), 1);
}

TEST(ShardedTensor, StagingDirectoryIsNeverLoadable) {
  TempDir tmp;
  Tensor t = random_tensor({4, 4}, DType::F32, 10);
  std::string dir = save_as(tmp.path(), 1, t, {{{0, 0}, {4, 4}}});
  std::filesystem::copy(dir, dir + ".tmp-0123abcd");
  EXPECT_NO_THROW(CheckpointReader{dir});
  EXPECT_THROW(CheckpointReader{dir + ".tmp-0123abcd"}, Error);
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
