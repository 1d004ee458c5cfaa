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
  bool sequence_parallel() const { return n != n_local; }

  static ActivationDims of(const TransformerConfig& m, const ParallelConfig& parallel, int64_t micro_batch_size,
                           DType activation_dtype);
};

// A norm's saved statistics: rstd (RMSNorm), rstd + mean (LayerNorm), fp32 per row of [n_local].
int64_t norm_stats_bytes(const TransformerConfig& m, const ActivationDims& d);

}  // namespace mcpp
