// ModelChunk: a GPTModel (one pipeline stage / virtual chunk) together with the ParamAndGradBuffers its
// parameters live in — Megatron's model chunk wrapped for data parallelism (DistributedDataParallel owns the
// module's param and grad buffers there; here the reductions are DistributedDataParallel over each buffer).
//
// The model registers its parameters into params() and its MoE experts' into expert_params() (models/ sees only
// core/parameter.h's ParameterRegistry); the constructor then allocates and initializes both (finalize: values
// depend on the key and the seed only), so a ModelChunk is ready for forward / backward as soon as it exists.
// Every GPTModel member (forward_step, backward_step, forward_loss, ...) is inherited.
#pragma once
#include <cstdint>
#include <vector>

#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/models/gpt/gpt_model.h"

namespace mcpp {

namespace detail {
// Constructed before the GPTModel base (base-from-member): the buffers outlive the modules that point into them.
struct ModelChunkBuffers {
  ParamAndGradBuffer param_buffer_;
  ParamAndGradBuffer expert_buffer_;
};
}  // namespace detail

class ModelChunk : private detail::ModelChunkBuffers, public GPTModel {
 public:
  // param_dtype: F32, or BF16/F16 for mixed precision (bf16 params and activations, fp32 main params
  // and grads, fp32 softmax/CE statistics) — the CUDA backend's training mode.
  ModelChunk(const TransformerConfig& config, uint64_t seed, const tensor_parallel::TPContext& tp,
             Device device = Device::CPU, const GPTModelStage& stage = {}, DType param_dtype = DType::F32)
      : ModelChunk(get_gpt_model_spec(config), config, seed, tp, device, stage, param_dtype) {}
  // The same, built from an explicit spec (models/gpt/gpt_layer_specs.h) instead of the config's default one.
  ModelChunk(const GPTModelSpec& spec, const TransformerConfig& config, uint64_t seed,
             const tensor_parallel::TPContext& tp, Device device = Device::CPU, const GPTModelStage& stage = {},
             DType param_dtype = DType::F32)
      : detail::ModelChunkBuffers(), GPTModel(param_buffer_, expert_buffer_, config, spec, tp, device, stage) {
    param_buffer_.finalize(seed, device, param_dtype);
    if (has_expert_params()) expert_buffer_.finalize(seed, device, param_dtype);
  }

  ParamAndGradBuffer& params() { return param_buffer_; }
  // The experts' parameters of the MoE layers (transformer/moe/experts.h; ParamSpec::expert), in a buffer of their
  // own that DDP reduces over expert-DP; empty (and unfinalized) without MoE layers on this stage.
  ParamAndGradBuffer& expert_params() { return expert_buffer_; }
  bool has_expert_params() const { return !expert_buffer_.params().empty(); }
  // params(), then expert_params() when there are any: every parameter of this chunk.
  std::vector<ParamAndGradBuffer*> buffers() {
    std::vector<ParamAndGradBuffer*> out{&params()};
    if (has_expert_params()) out.push_back(&expert_params());
    return out;
  }
};

}  // namespace mcpp
