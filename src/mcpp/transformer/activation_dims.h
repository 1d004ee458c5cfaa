// The sizes a module's saved-activation formula reads (the memory planner, tools/memory_planner.h, sums the
// modules' `saved_bytes` over a pipeline chunk; each module keeps its formula next to its forward, and the tests
// compare every one with the bytes the forward really keeps: pipeline_parallel::context_bytes).
// Per TP rank, for one microbatch: n = s*b rows, n_local = n / tp under sequence parallelism (else n), e = bytes of
// the activation dtype (the param dtype), np / ng / f per TP rank, s = this CP rank's rows (seq_length / cp).
#pragma once
#include <cstdint>

#include "mcpp/core/dtype.h"
#include "mcpp/parallel_state/parallel_config.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

struct ActivationDims {
  int64_t s = 0, b = 0, n = 0, n_local = 0, h = 0, hn = 0, np = 0, ng = 0, f = 0, e = 0;
  int64_t tp = 1, cp = 1, ep = 1, etp = 1;
  bool cp_ring = false;  // context parallelism's ring form (p2p), else all-to-all
  Device device = Device::CPU;  // where the activations live: the format of the FP8 casts kept (fp8_saved_bytes)
  bool fp8 = false;  // this layer's linears are FP8 with per-tensor scaling: each keeps its casts, not its input
  bool sequence_parallel() const { return n != n_local; }

  static ActivationDims of(const TransformerConfig& m, const ParallelConfig& parallel, int64_t micro_batch_size,
                           DType activation_dtype);
};

// A norm's saved statistics: rstd (RMSNorm), rstd + mean (LayerNorm), fp32 per row of [n_local].
int64_t norm_stats_bytes(const TransformerConfig& m, const ActivationDims& d);

// What an FP8 per-tensor linear [in -> out] over `rows` keeps for its backward in place of its input (ops.h Fp8Saved,
// tensor_parallel/layers.h ParallelLinearCtx::fp8_saved): on CUDA q(x)^T and q(w)^T as fp8 bytes, each followed by
// its 16-byte aligned scale_inv; on the CPU backend the emulated q(x) and q(w) in float32.
int64_t fp8_saved_bytes(const ActivationDims& d, int64_t rows, int64_t in, int64_t out);

// Whether layer `layer`'s linears keep FP8 casts: FP8 on with a per-tensor recipe (delayed / tensorwise; blockwise
// keeps the input) and the layer not among --first-last-layers-bf16's.
bool fp8_keeps_casts(const TransformerConfig& m, int64_t layer);

}  // namespace mcpp
