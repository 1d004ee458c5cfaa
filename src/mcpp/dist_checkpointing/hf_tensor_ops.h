// Small fp32 CPU tensor rearrangements used by the HF converters (hf_convert.cpp, hf_import.cpp).
//
// Contract: inputs are contiguous CPU F32 tensors; outputs are fresh tensors (no aliasing). "Rows" are
// the first dimension; a 1-D tensor [n] is treated as n rows of one element, so the same helpers
// handle weights and biases.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp::dist_checkpointing::hf_detail {

Tensor transpose2d(const Tensor& x);                                  // [a, b] -> [b, a]
Tensor slice_rows(const Tensor& x, int64_t start, int64_t count);     // rows [start, start+count)
Tensor cat_rows(const std::vector<Tensor>& parts);                    // same trailing dims
Tensor pad_rows(const Tensor& x, int64_t rows);                       // zero rows appended

// Megatron's grouped QKV rows [(nq + 2 ng) d, ...] <-> separate Q [nq d, ...], K [ng d, ...], V.
std::array<Tensor, 3> split_qkv(const Tensor& qkv, int64_t nq, int64_t ng, int64_t d);
Tensor merge_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t nq, int64_t ng, int64_t d);

}  // namespace mcpp::dist_checkpointing::hf_detail
