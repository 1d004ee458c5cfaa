// Ring attention: context parallelism in Megatron's --cp-comm-type p2p form (Transformer Engine's
// AttnFuncWithCPAndKVP2P). Unlike the all-to-all form, no rank ever holds the whole sequence: each CP rank keeps
// its load-balanced rows of q, k and v (context_parallel.h: chunks r and 2cp-1-r of c rows each, "half 0" and
// "half 1") and the key / value blocks travel around the ring (rank r sends to r+1 and receives from r-1) while
// every rank attends its queries to the block it holds. With j = the rank whose keys arrive at step i (r - i mod cp):
//   step 0 (j = r):  (q half 0, k half 0) causal, (1, 0) full, (1, 1) causal
//   j < r:           (0, 0) and (1, 0), full      j > r: (1, 0) and (1, 1), full
// — every other pair lies wholly in the queries' future. Each pair is one flash_attention_fwd over c x c rows;
// the results merge by their log-sum-exp (ops::attention_merge) into float32 accumulators, so the output equals
// one causal attention over the whole sequence. The backward runs the ring again: each pair's
// flash_attention_bwd with the merged output and lse gives its share of dq (kept, float32) and of dk / dv
// (float32, passed on with the block and delivered to its owner after the last step). The next block's send /
// receive is posted before the current block's math, so the transfer overlaps it; so does each block's dk / dv
// share from the ranks before (this rank's share goes into a fresh buffer, the two are added after the math).
// Saved (CoreAttentionCtx): q, k, v, out and lse = float32 [2, b, np, c] (the two halves' log-sum-exp).
// Attention dropout: one key drawn as the unsplit attention draws it ([b, np, S, S], S = 2 cp c), and each block
// call placed in that mask (AttentionOptions::dropout_seq_length / offsets): the same mask as one rank's attention
// (on CUDA the mcpp kernels run those calls: cuDNN's RNG cannot draw it).
#pragma once
#include <memory>
#include <vector>

#include "mcpp/comm/communicator.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/dot_product_attention.h"

namespace mcpp {

std::unique_ptr<CoreAttention> make_ring_attention(const CoreAttentionOptions& opt, comm::CommPtr cp);

namespace ring_attention {

struct Block {
  int q_half, k_half;
  bool causal;
};
// The (query half, key half) pairs rank `rank` of `cp` computes at step `step` (see the header).
std::vector<Block> blocks(int step, int rank, int cp);

// One step of the forward at rank `rank`: the pairs of (q, the arriving k / v) merged into o_acc float32
// [2c, b, np, d] and lse_acc float32 [2, b, np, c]. Step 0 writes them (no initialization needed), the others
// merge. opt.causal is ignored (each pair's own); with opt.dropout_p > 0 each pair is placed in the whole sequence's
// mask (opt.dropout_key is the unsplit attention's).
void forward_step(Tensor& o_acc, Tensor& lse_acc, const Tensor& q, const Tensor& k, const Tensor& v, int step,
                  int rank, int cp, const ops::AttentionOptions& opt);

// One step of the backward: the pairs' gradients added into dq_acc float32 [2c, b, np, d] and dk_acc / dv_acc
// float32 [2c, b, ng, d] (the arriving block's); out [2c, b, np, d] and lse are the forward's merged results.
void backward_step(Tensor& dq_acc, Tensor& dk_acc, Tensor& dv_acc, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, int step, int rank, int cp,
                   const ops::AttentionOptions& opt);

}  // namespace ring_attention
}  // namespace mcpp
