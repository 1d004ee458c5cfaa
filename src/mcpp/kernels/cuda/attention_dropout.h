// Attention dropout on the CUDA attention ops (attention.cpp, attention_qkv.cpp): checks
// AttentionOptions::dropout_p (0 <= p < 1) and copies the key into the AttnShape the kernels read (the mcpp
// kernels: philox.cuh AttnDropout, the CPU's mask; cuDNN: its RNG node's seed / offset, its own mask —
// kernels/cudnn/cudnn_attention.cpp takes a dropout call only where it can run its forward and backward).
#pragma once
#include "mcpp/kernels/cuda/launch.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {

void set_attention_dropout(const char* op, cuda_detail::AttnShape& a, const AttentionOptions& opt);
// A dropout call placed in a longer sequence's mask (AttentionOptions::dropout_seq_length): the mcpp kernels draw
// it; cuDNN's RNG node cannot.
bool dropout_block_of_larger_mask(const cuda_detail::AttnShape& a);

}  // namespace mcpp::ops::cuda
