// Parameters in contiguous buffers (DESIGN.md decision 5; Megatron-Core's _ParamAndGradBuffer).
//
// Modules register each parameter (logical key, shape, init, weight-decay flag) while they are built;
// finalize() then allocates ONE param buffer (the model's dtype: fp32, or bf16 for mixed precision) and
// ONE fp32 main-grad buffer, laid out in backward
// order (the reverse of registration, i.e. the order gradients become ready), binds every Parameter's
// `data` and `main_grad` to views into them, and initializes values. Later the DP buckets are ranges of
// these buffers. Gradients ACCUMULATE into main_grad (+=); zero_grad() clears the whole buffer — or, with
// set_overwrite_main_grad(true) (the trainer's default), clears nothing and marks every parameter's
// main_grad stale: the step's first writer of a parameter either overwrites it (take_grad_overwrite: the
// wgrad GEMM with beta = 0, Transformer Engine's overwrite_main_grad) or, when it can only accumulate,
// zeroes it first (materialize_grads); zero_stale_grads() zeroes what no backward wrote, before the grads
// are read. This saves the buffer's zeroing pass and the first wgrad GEMM's read of main_grad. Every
// writer of main_grad must take one of the two paths (Parameter::grad_ready checks it).
// Mixed precision (param dtype bf16/f16, Megatron's --bf16 with fp32 main params): a third buffer holds
// the fp32 main (master) params in the same layout; every Parameter's `main_param` views it, `data` is
// the low-precision model copy the forward reads, and the optimizer steps `main_param` and writes
// `data`. With fp32 params, main_param and data are the same tensor. The distributed optimizer keeps only
// its DP rank's shard of the masters (Megatron's sharded fp32 main params): once it has copied its shard
// it calls release_main_params(), which frees the whole master buffer and leaves every `main_param`
// undefined — the masters then live only in the optimizer's shards (and checkpoints write them from there).
//
// Initialization is Megatron's (init_method_normal / scaled_init_method_normal, zeros for biases, ones
// for norm weights) drawn from a Philox stream keyed by (seed, xxh3(key)) over the LOGICAL tensor, then
// sliced to this rank's shard: a parameter's initial value depends only on its key and the seed — not
// on registration order or the parallel layout (Megatron's --use-cpu-initialization semantics).
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
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
// Whether a parameter's gradient counts in the global norm on this TP rank: each element once over the
// model-parallel group (Megatron's param_is_not_shared && param_is_not_tensor_parallel_duplicate).
struct ParamSpec;
bool counts_in_grad_norm(const ParamSpec& spec, int tp_rank);

// Copy between a local shard and its logical tensor (CPU, float32).
void copy_shard_from_global(Tensor& local, const Tensor& global, const TensorShard& shard);
void copy_shard_to_global(Tensor& global, const Tensor& local, const TensorShard& shard);

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
  // An expert's parameter (moe/experts.h; Megatron's allreduce = False): held by one EP rank, replicated over
  // expert-DP only; it lives in the model's expert buffer (reduced over expert-DP), its squares are summed over
  // EP in the grad norm, and a checkpoint takes it from one expert-DP replica.
  bool expert = false;
  Shape global_shape() const { return shard.partitioned() ? shard.global_shape : shape; }
};

class ParamAndGradBuffer;

struct Parameter {
  ParamSpec spec;
  Tensor data;        // model param (the buffer's param dtype): view into the param buffer
  Tensor main_param;  // fp32 master value: = data with fp32 params, else a view into the main-param buffer
  Tensor main_grad;   // fp32 view into the grad buffer; accumulates
  ParamAndGradBuffer* buffer = nullptr;
  int64_t offset = 0;  // of data / main_grad in the buffers (elements)
  // main_grad holds a previous step's values (zero_grad under set_overwrite_main_grad); see above.
  bool grad_stale = false;
  // Called by the module right after its backward finished accumulating this parameter's gradient for
  // the current microbatch (once per microbatch, after the last use of a shared weight). Forwards to the
  // buffer's grad-ready hook: DistributedDataParallel starts a bucket's reduction when all are ready.
  void grad_ready();
};

// For a writer that computes the parameters' whole gradients in one go (a linear backward: weight, bias):
// true when all are stale — the caller must then OVERWRITE every one of them (the marks are cleared);
// otherwise the stale ones are zeroed (materialize_grads) and the caller accumulates. nullptrs are skipped.
bool take_grad_overwrite(std::initializer_list<Parameter*> params);
// For a writer that accumulates: zeroes the stale main grads among `params` (adjacent ones in one fill) and
// clears their marks. nullptrs are skipped; a no-op (no launch) when none is stale.
void materialize_grads(std::initializer_list<Parameter*> params);

class ParamAndGradBuffer {
 public:
  Parameter* add(ParamSpec spec);  // before finalize(); keys must be unique
  // Allocates and initializes (in fp32 on the host, then cast: the model copy is the rounded master).
  void finalize(uint64_t seed, Device device = Device::CPU, DType param_dtype = DType::F32);
  bool finalized() const { return finalized_; }

  void zero_grad();
  // zero_grad() marks main grads stale instead of zeroing the buffer (see the top of this file). Default off.
  void set_overwrite_main_grad(bool on) { overwrite_main_grad_ = on; }
  bool overwrite_main_grad() const { return overwrite_main_grad_; }
  // Zeroes every main grad still stale (no backward wrote it this step; one fill per adjacent run). Call
  // before the gradients are reduced or read (DistributedDataParallel's grad sync does).
  void zero_stale_grads();
  // Elements of stale main grads zeroed so far (materialize_grads, zero_stale_grads): the part of the
  // buffer the overwrite mode still zeroes (norms, embeddings, unwritten params); tests read it.
  int64_t stale_grads_zeroed() const { return stale_grads_zeroed_; }
  // Hook for Parameter::grad_ready (DDP's overlap of gradient reduction with backward); empty = none.
  void set_grad_ready_hook(std::function<void(Parameter&)> hook) { grad_ready_hook_ = std::move(hook); }
  const std::function<void(Parameter&)>& grad_ready_hook() const { return grad_ready_hook_; }
  const std::vector<std::unique_ptr<Parameter>>& params() const { return params_; }  // registration order
  Parameter* find(const std::string& key) const;  // nullptr when absent
  Tensor& param_buffer() { return param_buffer_; }
  // fp32 master values of every parameter (the param buffer itself with fp32 params); mcpp::Error after
  // release_main_params().
  Tensor& main_param_buffer();
  bool mixed_precision() const { return param_buffer_.dtype() != DType::F32; }
  // Mixed precision only: frees the whole fp32 master buffer (the distributed optimizer holds this rank's
  // shard of it); every Parameter's main_param becomes undefined. mcpp::Error with fp32 params.
  void release_main_params();
  // Whether every parameter's fp32 master is here (main_param defined): false only after release.
  bool has_main_params() const { return !main_params_released_; }
  Tensor& grad_buffer() { return grad_buffer_; }
  int64_t numel() const { return param_buffer_.numel(); }

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
  Tensor param_buffer_;
  Tensor main_param_buffer_;  // fp32 masters, only with a low-precision param dtype
  Tensor grad_buffer_;
  bool finalized_ = false;
  bool main_params_released_ = false;
  bool overwrite_main_grad_ = false;
  int64_t stale_grads_zeroed_ = 0;
  // Zeroes the stale main grads among ps (one fill per adjacent run of a buffer) and clears their marks.
  static void zero_stale(std::vector<Parameter*> ps);
  friend void materialize_grads(std::initializer_list<Parameter*> params);
  std::function<void(Parameter&)> grad_ready_hook_;
};

// Fill a float32 CPU tensor with N(0, std) from the Philox stream of (seed, key).
void init_normal(Tensor& t, float std, uint64_t seed, const std::string& key);

}  // namespace mcpp
