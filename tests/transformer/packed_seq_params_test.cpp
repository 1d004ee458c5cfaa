// packed_seq_params (transformer/packed_seq_params.h): cu_seqlens -> position_ids [s, b] / doc_start [b, s], and
// Megatron's documents of a pretraining sample (_get_ltor_masks_and_position_ids: a document ends after each EOD).
#include <gtest/gtest.h>

#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/transformer/packed_seq_params.h"

namespace mcpp {
namespace {

TEST(PackedSeqParams, PositionsRestartAndDocumentStarts) {
  const int64_t s = 6, b = 2;
  const PackedSeqParams p = packed_seq_params_from_cu_seqlens({{0, 2, 6}, {0, 1, 4, 6}}, s,
                                                              {.reset_position_ids = true, .reset_attention_mask = true});
  const std::vector<std::vector<int32_t>> pos = {{0, 1, 0, 1, 2, 3}, {0, 0, 1, 2, 0, 1}};
  const std::vector<std::vector<int32_t>> start = {{0, 0, 2, 2, 2, 2}, {0, 1, 1, 1, 4, 4}};
  for (int64_t ib = 0; ib < b; ++ib)
    for (int64_t i = 0; i < s; ++i) {
      EXPECT_EQ(p.position_ids.data<int32_t>()[i * b + ib], pos[ib][i]) << ib << " " << i;  // [s, b]
      EXPECT_EQ(p.doc_start.data<int32_t>()[ib * s + i], start[ib][i]) << ib << " " << i;   // [b, s]
    }
  const PackedSeqParams only_pos = packed_seq_params_from_cu_seqlens({{0, 6}}, s, {.reset_position_ids = true});
  EXPECT_TRUE(only_pos.position_ids.defined());
  EXPECT_FALSE(only_pos.doc_start.defined());
}

TEST(PackedSeqParams, DocumentsEndAfterEod) {
  const int64_t s = 7, b = 2, eod = 9;
  Tensor tokens = Tensor::empty({s, b}, DType::I32);
  const std::vector<std::vector<int32_t>> cols = {{1, 9, 2, 3, 9, 4, 9}, {9, 9, 5, 6, 7, 8, 1}};
  for (int64_t ib = 0; ib < b; ++ib)
    for (int64_t i = 0; i < s; ++i) tokens.data<int32_t>()[i * b + ib] = cols[ib][i];
  const auto cu = cu_seqlens_from_eod(tokens, eod);
  // the EOD belongs to the document it ends; one in the last position ends the sample anyway
  EXPECT_EQ(cu[0], (std::vector<int32_t>{0, 2, 5, 7}));
  EXPECT_EQ(cu[1], (std::vector<int32_t>{0, 1, 2, 7}));
}

}  // namespace
}  // namespace mcpp
