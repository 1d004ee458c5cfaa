// The FP8 settings a tensor-parallel linear takes (ParallelLinearOptions::fp8): what the recipe is, without the
// state (fp8_state.h). A plain header, so the model's config (transformer/transformer_config.h) can name it.
#pragma once
#include <cstdint>
#include <memory>

namespace mcpp::tensor_parallel {

// Blockwise: DeepSeek-V3's 1x128 / 128x128 scaling (ops.h Fp8Block): per-call scales, no state.
enum class Fp8Recipe { Delayed, Tensorwise, Blockwise };

class Fp8UpdateGroup;  // fp8_state.h

// The model's FP8 settings (TransformerConfig's fp8 fields, transformer/transformer_config.h fp8_options()).
struct Fp8Options {
  bool enabled = false;
  bool hybrid = false;  // --fp8-format hybrid: e5m2 output gradients (else e4m3 everywhere; blockwise too)
  Fp8Recipe recipe = Fp8Recipe::Delayed;
  int64_t amax_history_len = 1024;
  bool amax_most_recent = false;  // --fp8-amax-compute-algo most_recent (else max)
  int margin = 0;
  // Delayed: the model chunk's group that updates every linear's scales at the end of each pass (fp8_state.h; set
  // by GPTModel). Null: each linear updates its own right after its GEMM.
  std::shared_ptr<Fp8UpdateGroup> updates;
};

}  // namespace mcpp::tensor_parallel
