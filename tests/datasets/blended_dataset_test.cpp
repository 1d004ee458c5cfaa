// BlendedDataset (Megatron's --data-path blend): get_blend_from_list's parse and its refusals; build_blending_indices
// against values worked by hand from Megatron's rule and its defining property (every prefix of the order holds
// each dataset within one sample of its share); the blend's samples are its datasets' samples, each dataset built
// to Megatron's ceil(ceil(N w) * 1.005) samples; a single prefix is that prefix's GPTDataset itself.
#include "mcpp/datasets/blended_dataset.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "core/core_test_util.h"
#include "mcpp/core/error.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;

std::string make_corpus(const std::string& name, int nseq, uint32_t seed, int32_t first_token) {
  const fs::path dir = fs::temp_directory_path() / ("mcpp_blend_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string prefix = (dir / "corpus").string();
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> len(1, 40);
  IndexedDatasetBuilder b(bin_path(prefix), IndexedDType::I32);
  int32_t next = first_token;
  for (int q = 0; q < nseq; ++q) {
    std::vector<int32_t> s(static_cast<size_t>(len(gen)));
    for (auto& t : s) t = next++;
    b.add_item(std::span<const int32_t>(s));
    b.end_document();
  }
  b.finalize(idx_path(prefix));
  return prefix;
}

std::string error_of(const std::vector<std::string>& path) {
  return mcpp::testing::error_of([&] { parse_data_blend(path); });
}

TEST(DataBlend, ParsesMegatronsListAndRefusesTheRest) {
  const DataBlend one = parse_data_blend({"/d/a"});
  EXPECT_EQ(one.prefixes, std::vector<std::string>{"/d/a"});
  EXPECT_TRUE(one.weights.empty());
  const DataBlend two = parse_data_blend({"3", "/d/a", "1", "/d/b"});
  EXPECT_EQ(two.prefixes, (std::vector<std::string>{"/d/a", "/d/b"}));
  EXPECT_EQ(two.weights, (std::vector<double>{0.75, 0.25}));
  EXPECT_EQ(parse_data_blend({"1", "/d/a"}).weights, std::vector<double>{1.0});  // weighted: a blend of one
  const DataBlend unweighted = parse_data_blend({"/d/a", "/d/b", "/d/c"});  // weighed by size when built
  EXPECT_EQ(unweighted.prefixes, (std::vector<std::string>{"/d/a", "/d/b", "/d/c"}));
  EXPECT_TRUE(unweighted.by_size);
  EXPECT_TRUE(unweighted.weights.empty());
  EXPECT_FALSE(parse_data_blend({"/d/a"}).by_size);
  EXPECT_NE(error_of({"/d/a", "0.5", "/d/b"}).find("mixes weights and prefixes"), std::string::npos);
  EXPECT_NE(error_of({"0.5", "/d/a", "/d/b", "/d/c"}).find("mixes weights and prefixes"), std::string::npos);
  EXPECT_NE(error_of({"0", "/d/a", "1", "/d/b"}).find("the weight of '/d/a' is 0"), std::string::npos);
  EXPECT_NE(error_of({"-1", "/d/a", "2", "/d/b"}).find("must be positive"), std::string::npos);
  EXPECT_NE(error_of({}).find("data_path"), std::string::npos);
}

TEST(DataBlend, BlendingIndicesFollowMegatronsGreedyRule) {
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  // weights 0.3 / 0.7, errors w * max(i, 1) - count: i 0: 0.3, 0.7 -> 1; i 1: 0.3, -0.3 -> 0; i 2: -0.4, 0.4 -> 1;
  // i 3: -0.1, 0.1 -> 1; i 4: 0.2, -0.2 -> 0; i 5: -0.5, 0.5 -> 1; i 6: -0.2, 0.2 -> 1; i 7: 0.1, -0.1 -> 0;
  // i 8: -0.6, 0.6 -> 1; i 9: -0.3, 0.3 -> 1
  build_blending_indices(di, dsi, {0.3, 0.7}, 10);
  EXPECT_EQ(di, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
  // ties go to the first dataset: equal weights alternate 0, 1 after the first pick (i 0: 0.5 vs 0.5 -> 0)
  build_blending_indices(di, dsi, {0.5, 0.5}, 4);
  EXPECT_EQ(di, (std::vector<int16_t>{0, 1, 0, 1}));
  // any weights: every prefix within one sample of its share; each dataset's samples taken in order
  const std::vector<double> w = {0.05, 0.2, 0.15, 0.6};
  build_blending_indices(di, dsi, w, 5000);
  std::vector<int64_t> count(w.size(), 0);
  for (size_t i = 0; i < di.size(); ++i) {
    const auto d = static_cast<size_t>(di[i]);
    EXPECT_EQ(dsi[i], count[d]) << i;
    ++count[d];
    for (size_t k = 0; k < w.size(); ++k)
      ASSERT_LE(std::abs(static_cast<double>(count[k]) - w[k] * static_cast<double>(i + 1)), 1.0 + 1e-9)
          << "sample " << i << " dataset " << k;
  }
  EXPECT_EQ(blended_dataset_samples(1000, 0.3), 302);  // ceil(ceil(300) * 1.005) = ceil(301.5)
  EXPECT_EQ(blended_dataset_samples(7, 0.25), 3);      // ceil(ceil(1.75) * 1.005) = ceil(2.01)
}

TEST(DataBlend, SamplesAreTheDatasetsSamples) {
  const std::string a = make_corpus("a", 300, 1, 0), b = make_corpus("b", 200, 2, 1000000);
  const GPTDatasetOptions opt{.prefix = {}, .split = "9,1,0", .split_index = 0, .seq_length = 16, .num_samples = 400,
                              .seed = 7};
  const BlendedDataset blend(parse_data_blend({"0.3", a, "0.7", b}), opt);
  ASSERT_EQ(blend.size(), 400);
  ASSERT_EQ(blend.datasets().size(), 2u);
  // each dataset is the GPTDataset of its prefix with Megatron's per-dataset sample count
  GPTDatasetOptions oa = opt, ob = opt;
  oa.prefix = a, oa.num_samples = blended_dataset_samples(400, 0.3);
  ob.prefix = b, ob.num_samples = blended_dataset_samples(400, 0.7);
  const GPTDataset da(oa), db(ob);
  EXPECT_EQ(blend.datasets()[0]->shuffle_index(), da.shuffle_index());
  EXPECT_EQ(blend.datasets()[1]->shuffle_index(), db.shuffle_index());
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices(di, dsi, {0.3, 0.7}, 400);
  std::vector<int32_t> got(17), want(17);
  std::vector<float> gm(16), wm(16);
  int64_t from_a = 0;
  for (int64_t i = 0; i < 400; ++i) {
    blend.sample(i, got, gm);
    (di[static_cast<size_t>(i)] == 0 ? da : db).sample(dsi[static_cast<size_t>(i)], want, wm);
    ASSERT_EQ(got, want) << i;
    // the corpora's token ranges tell the source apart
    EXPECT_EQ(got[0] < 1000000, di[static_cast<size_t>(i)] == 0) << i;
    EXPECT_EQ(blend.prefix_of(i), di[static_cast<size_t>(i)] == 0 ? a : b);
    from_a += di[static_cast<size_t>(i)] == 0;
  }
  EXPECT_EQ(from_a, 120);
  // one prefix: the prefix's own dataset, same size and order
  GPTDatasetOptions single = opt;
  single.prefix = a;
  const GPTDataset ds(single);
  const BlendedDataset pass(parse_data_blend({a}), opt);
  EXPECT_EQ(pass.size(), ds.size());
  for (int64_t i = 0; i < 50; ++i) {
    pass.sample(i, got, gm);
    ds.sample(i, want, wm);
    ASSERT_EQ(got, want) << i;
  }
  EXPECT_THROW(BlendedDataset(parse_data_blend({"1", a, "1", "/nonexistent/prefix"}), opt), Error);
}

// Prefixes without weights (Megatron's weights None): one epoch of each prefix's split, weighed by those sizes, the
// blend min(N, their sum) samples long; every sample of each epoch read exactly once over the whole blend.
TEST(DataBlend, UnweightedPrefixesAreWeighedByTheirSizes) {
  const std::string a = make_corpus("ua", 300, 3, 0), b = make_corpus("ub", 120, 4, 1000000);
  GPTDatasetOptions opt{.prefix = {}, .split = "9,1,0", .split_index = 0, .seq_length = 16, .num_samples = 0, .seed = 7};
  GPTDatasetOptions oa = opt, ob = opt;
  oa.prefix = a, ob.prefix = b;  // num_samples 0: one epoch (Megatron's num_samples None)
  const GPTDataset da(oa), db(ob);
  const int64_t total = da.size() + db.size();
  ASSERT_GT(da.size(), 2 * db.size() - 40);  // unequal sizes: the weights matter
  for (const int64_t n : {total, total - 37}) {
    SCOPED_TRACE(n);
    opt.num_samples = n;
    const BlendedDataset blend(parse_data_blend({a, b}), opt);
    ASSERT_EQ(blend.size(), n);
    EXPECT_EQ(blend.datasets()[0]->shuffle_index(), da.shuffle_index());
    EXPECT_EQ(blend.datasets()[1]->shuffle_index(), db.shuffle_index());
    std::vector<int16_t> di;
    std::vector<int64_t> dsi;
    const double wa = static_cast<double>(da.size()) / static_cast<double>(total);
    build_blending_indices(di, dsi, {wa, 1.0 - wa}, n);
    EXPECT_EQ(blend.dataset_index(), di);
    EXPECT_EQ(blend.dataset_sample_index(), dsi);
    std::vector<int32_t> got(17), want(17);
    std::vector<float> gm(16), wm(16);
    int64_t from_a = 0;
    for (int64_t i = 0; i < n; ++i) {
      blend.sample(i, got, gm);
      (di[static_cast<size_t>(i)] == 0 ? da : db).sample(dsi[static_cast<size_t>(i)], want, wm);
      ASSERT_EQ(got, want) << i;
      from_a += di[static_cast<size_t>(i)] == 0;
    }
    if (n == total) EXPECT_EQ(from_a, da.size());  // the whole blend: each epoch exactly once
    else EXPECT_LE(std::abs(static_cast<double>(from_a) - wa * static_cast<double>(n)), 1.0);
  }
  // a split needing more than the epochs hold: one named error, not a short blend
  opt.num_samples = total + 1;
  try {
    BlendedDataset(parse_data_blend({a, b}), opt);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("holds {} samples", total)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train split needs"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mcpp
