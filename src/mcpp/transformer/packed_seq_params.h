// Packed sequences (Megatron-Core's PackedSeqParams, megatron/core/packed_seq_params.py; Megatron-LM's
// --reset-position-ids / --reset-attention-mask and the SFT dataset's cu_seqlens): several documents share one
// sample of a [s, b] micro batch. Per sample the documents are given by their boundaries cu_seqlens
// (0 = c_0 < c_1 < ... < c_n = s: document k holds positions [c_k, c_{k+1})). From them:
//   position_ids [s, b] int32: the position of each token within its document (i - c_k) — the learned position
//     embedding's ids and the rows of the rotary tables (RoPE restarts per document);
//   doc_start [b, s] int32: c_k for each position i of document k — the core attention's document mask
//     (ops::AttentionOptions::doc_start: query i attends keys [c_k, i]).
// Either may be undefined (Megatron's two flags are independent): positions 0..s-1 / one document a sample.
// A packed batch run through GPTModel equals running each document as a sample of its own (transformer and model
// tests), on every backend. Tensors are built on the host; GPTModel moves them to its device (to_device).
// Not with context parallelism (each CP rank would need its rows' documents; refused by the trainer).
#pragma once
#include <cstdint>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp {

struct PackedSeqParams {
  Tensor position_ids;  // int32 [s, b] (row is * b + ib, the activations' token order), or undefined
  Tensor doc_start;     // int32 [b, s], or undefined
  bool defined() const { return position_ids.defined() || doc_start.defined(); }
  // The same tensors on `device` (copies only where they live elsewhere).
  PackedSeqParams to_device(Device device) const;
};

struct PackedSeqOptions {
  bool reset_position_ids = false;    // build position_ids
  bool reset_attention_mask = false;  // build doc_start
};

// cu_seqlens[ib]: sample ib's boundaries (starting 0, strictly increasing, ending s); an mcpp::Error names the
// sample and entry otherwise.
PackedSeqParams packed_seq_params_from_cu_seqlens(const std::vector<std::vector<int32_t>>& cu_seqlens, int64_t s,
                                                  const PackedSeqOptions& opt);

// Megatron's _get_ltor_masks_and_position_ids: in tokens [s, b] (int32, host) a document ends after each EOD token
// (the EOD belongs to the document it ends; the next one starts at the following position).
std::vector<std::vector<int32_t>> cu_seqlens_from_eod(const Tensor& tokens, int64_t eod_token);

}  // namespace mcpp
