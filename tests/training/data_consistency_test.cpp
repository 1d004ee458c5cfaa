// --check-data-consistency's verdict (training/data_consistency.h) on synthetic rank records: TP / CP / PP peers must
// hash alike, DP ranks must hold disjoint samples; the message names the iteration, group, microbatch and ranks.
#include "mcpp/training/data_consistency.h"

#include <gtest/gtest.h>

namespace mcpp {
namespace {

// TP2 x DP2 (Megatron's order tp-dp): tp groups {0,1} {2,3}, dp groups {0,2} {1,3}; mbs 2, two microbatches per DP
// rank of a global batch of 8 (DP rank r takes samples 4m + 2r .. 4m + 2r + 1).
std::vector<RankDataRecord> healthy() {
  std::vector<RankDataRecord> v;
  for (int r = 0; r < 4; ++r) {
    const int dp = r / 2;
    RankDataRecord rec{.rank = r, .tp_group = 2 * dp, .cp_group = r, .pp_group = r, .dp_group = r % 2,
                       .micro_batch_size = 2, .microbatches = {}};
    for (int64_t m = 0; m < 2; ++m) {
      const int64_t first = 4 * m + 2 * dp;
      rec.microbatches.push_back({.hash = 1000 + static_cast<uint64_t>(first), .first_sample = first,
                                  .dataset_index = first});
    }
    v.push_back(rec);
  }
  return v;
}

TEST(DataConsistency, HealthyLayoutPasses) { EXPECT_EQ(data_consistency_verdict(3, healthy()), ""); }

TEST(DataConsistency, TpPeerWithOtherTokensIsNamed) {
  auto v = healthy();
  v[1].microbatches[1].hash ^= 1;
  const std::string msg = data_consistency_verdict(7, v);
  EXPECT_NE(msg.find("iteration 7: the tp group [0, 1] disagrees on microbatch 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("global ranks [0, 1] hold different batches (no majority to blame)"), std::string::npos) << msg;
}

TEST(DataConsistency, TheMinorityOfAGroupIsNamed) {
  auto v = healthy();  // TP4: all four ranks one tp group (each its own dp group)
  for (int r = 0; r < 4; ++r) {
    RankDataRecord& rec = v[static_cast<size_t>(r)];
    rec.tp_group = 0, rec.dp_group = r, rec.microbatches = v[0].microbatches;
  }
  v[2].microbatches[0].hash ^= 1;
  const std::string msg = data_consistency_verdict(5, v);
  EXPECT_NE(msg.find("iteration 5: the tp group [0, 1, 2, 3] disagrees on microbatch 0: global rank(s) [2] differ"),
            std::string::npos) << msg;
}

TEST(DataConsistency, OverlappingDpSamplesAreNamed) {
  auto v = healthy();
  for (int r : {2, 3}) v[static_cast<size_t>(r)].microbatches[0].first_sample = 1;  // overlaps rank 0's 0..1
  for (int r : {2, 3}) v[static_cast<size_t>(r)].microbatches[0].dataset_index = 1;
  const std::string msg = data_consistency_verdict(2, v);
  EXPECT_NE(msg.find("the dp group [0, 2] is not disjoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("samples 1..2"), std::string::npos) << msg;
}

TEST(DataConsistency, IdenticalDpBatchesOfDifferentSamplesAreNamed) {
  auto v = healthy();
  for (int r : {2, 3}) v[static_cast<size_t>(r)].microbatches[0].hash = v[0].microbatches[0].hash;  // a shared shard
  const std::string msg = data_consistency_verdict(2, v);
  EXPECT_NE(msg.find("the dp group [0, 2] trains identical batches"), std::string::npos) << msg;
}

TEST(DataConsistency, TheSameDatasetSampleTwiceIsNotAnError) {
  auto v = healthy();  // a global batch larger than the dataset: samples 0 and 2 are both dataset sample 0
  for (int r : {2, 3}) {
    v[static_cast<size_t>(r)].microbatches[0].hash = v[0].microbatches[0].hash;
    v[static_cast<size_t>(r)].microbatches[0].dataset_index = v[0].microbatches[0].dataset_index;
  }
  EXPECT_EQ(data_consistency_verdict(2, v), "");
}

TEST(DataConsistency, HashCoversEveryTensor) {
  Tensor tok = Tensor::zeros({4, 2}, DType::I32), lab = Tensor::zeros({4, 2}, DType::I32), mask = Tensor::zeros({4, 2});
  const uint64_t h = microbatch_hash(tok, lab, mask, Tensor());
  EXPECT_EQ(h, microbatch_hash(tok, lab, mask, Tensor()));
  lab.data<int32_t>()[7] = 1;
  EXPECT_NE(h, microbatch_hash(tok, lab, mask, Tensor()));
  lab.data<int32_t>()[7] = 0;
  Tensor pos = Tensor::zeros({4, 2}, DType::I32);
  EXPECT_NE(h, microbatch_hash(tok, lab, mask, pos));
}

}  // namespace
}  // namespace mcpp
