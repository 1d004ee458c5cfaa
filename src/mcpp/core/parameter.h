// Parameter: what a module needs to name and register a parameter (DESIGN.md decision 5; Megatron's
// nn.Parameter with its tensor-parallel attributes), and ParameterRegistry, the interface modules register into.
//
// A module registers each parameter (logical key, shape, init, weight-decay flag, TP partition) through
// ParameterRegistry::add while it is built and keeps the returned Parameter*. The registry's implementation —
// distributed/param_and_grad_buffer.h, which modules never include — allocates the storage later and binds every
// Parameter's `data`, `main_param` and `main_grad` to views into its contiguous buffers.
//
// Gradients ACCUMULATE into main_grad (+=), except for a parameter marked stale (grad_stale: the buffer's
// overwrite mode left a previous step's values there instead of zeroing): its step's first writer either
// OVERWRITES it (take_grad_overwrite: the wgrad GEMM with beta = 0, Transformer Engine's overwrite_main_grad) or,
// when it can only accumulate, zeroes it first (materialize_grads). Every writer of main_grad takes one of the two
// paths (Parameter::grad_ready checks it). After its backward finished a parameter's gradient for the microbatch,
// the module calls grad_ready(), which reaches the registry's hook (DDP's overlapped bucket reduction).
//
// Initialization (init_normal) is Megatron's init_method_normal drawn from a Philox stream keyed by
// (seed, xxh3(key)) over the LOGICAL tensor, then sliced to this rank's shard (copy_shard_from_global): a value
// depends only on its key and the seed, not on registration order or the parallel layout.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp {

enum class InitKind { Normal, Zeros, Ones };

// Where a parameter's local tensor sits in its logical (layout-independent) tensor. Along
// partition_dim, local slices [local_offset, +length) are global slices [global_offset, +length).
// One segment for column/row/vocab-parallel weights; two for the SwiGLU fc1 (gate and up halves
// interleaved per TP rank). partition_dim < 0: the parameter is whole on this rank (replicated over TP).
struct ShardSegment {
  int64_t global_offset = 0;
  int64_t local_offset = 0;
  int64_t length = 0;
};
struct TensorShard {
  int partition_dim = -1;
  Shape global_shape;  // empty when not partitioned (= the local shape)
  std::vector<ShardSegment> segments;
  bool partitioned() const { return partition_dim >= 0; }
};

// Copy between a local shard and its logical tensor (CPU, float32).
void copy_shard_from_global(Tensor& local, const Tensor& global, const TensorShard& shard);
void copy_shard_to_global(Tensor& global, const Tensor& local, const TensorShard& shard);

// Fill a float32 CPU tensor with N(0, std) from the Philox stream of (seed, key).
void init_normal(Tensor& t, float std, uint64_t seed, const std::string& key);

struct ParamSpec {
  std::string key;  // e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape shape{};
  InitKind init = InitKind::Normal;
  float std = 0.02f;            // for InitKind::Normal
  bool no_weight_decay = false;  // biases and norm weights (Megatron's no_wd params)
  TensorShard shard{};           // tensor-parallel partition (Megatron's tensor_model_parallel attrs)
  // Replicated over TP but applied to sequence-parallel shards: its gradient is a partial sum that
  // finalize_model_grads all-reduces over TP (Megatron's param.sequence_parallel).
  bool sequence_parallel = false;
  // A copy of a parameter that another pipeline stage owns (the last stage's output weight tied to the
  // first stage's word embeddings; Megatron's `shared` attribute): same key and values, gradients
  // all-reduced over the embedding group; counted once in the grad norm and saved once (by the owner).
  bool shared_copy = false;
  // The tied word embedding when its two uses sit on different pipeline stages (set on the owner and on
  // the copy; Megatron's shared_embedding): with the distributed optimizer it gets a bucket of its own,
  // so both stages shard it identically over DP and the embedding-group all-reduce sums matching
  // (reduce-scattered) shards.
  bool shared_embedding = false;
  // An expert's parameter (transformer/moe/experts.h; Megatron's allreduce = False): held by one EP rank,
  // replicated over expert-DP only; it lives in the model's expert buffer (reduced over expert-DP), its squares
  // are summed over EP in the grad norm, and a checkpoint takes it from one expert-DP replica.
  bool expert = false;
  Shape global_shape() const { return shard.partitioned() ? shard.global_shape : shape; }
};

// Whether a parameter's gradient counts in the global norm on this TP rank: each element once over the
// model-parallel group (Megatron's param_is_not_shared && param_is_not_tensor_parallel_duplicate).
bool counts_in_grad_norm(const ParamSpec& spec, int tp_rank);

class ParameterRegistry;

struct Parameter {
  ParamSpec spec;
  Tensor data;        // model param (the buffer's param dtype): view into the param buffer
  Tensor main_param;  // fp32 master value: = data with fp32 params, else a view into the main-param buffer
  Tensor main_grad;   // fp32 view into the grad buffer; accumulates
  ParameterRegistry* registry = nullptr;  // where it was registered (the storage side's hooks)
  int64_t offset = 0;  // of data / main_grad in the registry's buffers (elements)
  // main_grad holds a previous step's values (the buffer's overwrite mode); see the top of this file.
  bool grad_stale = false;
  // Called by the module right after its backward finished accumulating this parameter's gradient for
  // the current microbatch (once per microbatch, after the last use of a shared weight). Forwards to the
  // registry's grad-ready hook: DistributedDataParallel starts a bucket's reduction when all are ready.
  void grad_ready();
};

// For a writer that computes the parameters' whole gradients in one go (a linear backward: weight, bias):
// true when all are stale — the caller must then OVERWRITE every one of them (the marks are cleared);
// otherwise the stale ones are zeroed (materialize_grads) and the caller accumulates. nullptrs are skipped.
bool take_grad_overwrite(std::initializer_list<Parameter*> params);
// For a writer that accumulates: zeroes the stale main grads among `params` (adjacent ones in one fill) and
// clears their marks. nullptrs are skipped; a no-op (no launch) when none is stale.
void materialize_grads(std::initializer_list<Parameter*> params);
// Zeroes the stale main grads among `params` (one fill per run of adjacent ones in a registry) and clears their
// marks: materialize_grads over a list (ParamAndGradBuffer::zero_stale_grads).
void zero_stale_main_grads(std::vector<Parameter*> params);

// Where modules register their parameters. The storage side (allocation, main grads, the grad-ready hook) is
// the implementation's: distributed/param_and_grad_buffer.h.
class ParameterRegistry {
 public:
  ParameterRegistry() = default;
  ParameterRegistry(const ParameterRegistry&) = delete;
  ParameterRegistry& operator=(const ParameterRegistry&) = delete;
  virtual ~ParameterRegistry() = default;

  // Registers a parameter (keys unique within the registry); its tensors are bound when the storage is
  // allocated. The pointer stays valid for the registry's lifetime.
  virtual Parameter* add(ParamSpec spec);
  const std::vector<std::unique_ptr<Parameter>>& params() const { return params_; }  // registration order
  Parameter* find(const std::string& key) const;  // nullptr when absent
  // Non-trainable module state a checkpoint keeps per rank (Transformer Engine's extra state: the FP8 scaling
  // state, tensor_parallel/fp8_state.h). The module owns the tensor (any device; a load copies into it) and keeps
  // it alive, at this address, as long as the registry.
  void add_rank_state(const std::string& key, Tensor* state);
  const std::vector<std::pair<std::string, Tensor*>>& rank_states() const { return rank_states_; }

 protected:
  friend struct Parameter;
  friend void zero_stale_main_grads(std::vector<Parameter*> params);
  // A parameter's gradient is final for this microbatch (Parameter::grad_ready).
  virtual void on_grad_ready(Parameter& p) = 0;
  // Zeroes main grads [offset, offset + numel) of the storage: a run of adjacent stale parameters.
  virtual void zero_main_grads(int64_t offset, int64_t numel) = 0;

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
  std::unordered_map<std::string, Parameter*> by_key_;  // params_ by key (a model of 10^4+ experts' parameters)
  std::vector<std::pair<std::string, Tensor*>> rank_states_;
};

}  // namespace mcpp
