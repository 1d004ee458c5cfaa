// DistributedOptimizer (Megatron-Core optimizer/distrib_optimizer.py): Adam(W) whose state is sharded over
// the data-parallel group, on top of DistributedDataParallel built with use_distributed_optimizer.
//
// Each DP rank owns the contiguous shard Bucket::owned_range(dp_rank, dp) of every bucket. After
// DistributedDataParallel::finish_grad_sync (a reduce-scatter, Avg over dp_cp) the owned ranges of the
// grad buffer hold the reduced grads. step(lr) then runs ops::adamw_step on each PIECE: the
// intersection of an owned range with one parameter, with that parameter's weight-decay flag (AdamW is
// elementwise, so a parameter split across ranks is updated exactly as the whole one would be). The
// fp32 main params: with fp32 model params, the owned ranges of the param buffer itself; with mixed
// precision (bf16/f16 model params), an fp32 tensor of shard_size per bucket holding ONLY this rank's shard
// of the masters (Megatron's sharded main params, 4/dp bytes a parameter): the constructor copies the shard
// from the buffer's initial masters and then frees the buffer's whole master copy (release_main_params);
// the step writes the rounded model copy of its pieces into the param buffer. Afterwards the updated
// shards are all-gathered back into the param buffer: blocking, or with overlap_param_gather posted
// async — then the trainer must call wait_param_gather() before the next forward (and before eval or
// saving a checkpoint). exp_avg / exp_avg_sq are one fp32 tensor of shard_size per bucket; pieces view them.
//
// grad_norm(): Megatron's get_grad_norm_fp32 over the shard: sum of squares of this rank's owned grads,
// counting a TP-replicated parameter only on tp rank 0 (param_is_not_tensor_parallel_duplicate),
// all-reduced over dp_cp and then mp (= every rank once). clip_grads(norm, max) scales the owned ranges.
// MoE experts under expert parallelism (wrappers built with DdpOptions::expert_parallel): their buckets are
// sharded over expert-DP (each wrapper's own group), and their squares sum over expert-DP, EP, then PP.
//
// Virtual pipeline stages (several model chunks per rank): one DistributedDataParallel per chunk (its
// own buffers and buckets) and ONE optimizer over all of them, as Megatron does: the pieces of every
// chunk's buckets, one step counter, one grad norm (all chunks' owned grads in one sum).
//
// Checkpoint state: state() lists every piece as (key, offset of the piece in the parameter's flat
// local tensor, numel, param_numel, exp_avg piece, exp_avg_sq piece, and with sharded masters the fp32
// main-param piece), so the state can be saved logically and reloaded under another DP size; load_state
// fills the moments from a lookup (the sharded masters are model weights: read with the model).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mcpp/distributed/data_parallel.h"
#include "mcpp/optimizer/adam.h"

namespace mcpp {

struct DistributedOptimizerOptions {
  AdamOptions adam;
  bool overlap_param_gather = false;
  // The model has MoE experts (on some pipeline stage): grad_norm() joins the expert groups' sums on every rank,
  // also where this rank's stage has no MoE layer (--moe-layer-freq) and so no expert wrapper.
  bool moe_model = false;
};

// One parameter's part of this rank's shard.
struct ShardPiece {
  Parameter* owner = nullptr;
  int64_t buffer_offset = 0;  // in the param / grad buffers
  int64_t param_offset = 0;   // within the parameter's flat (TP-local) tensor
  int64_t numel = 0;
  Tensor param{};             // [numel] fp32 main params: a view into the param buffer when it is fp32,
                              // else into this rank's master shard
  Tensor model_param{};       // [numel] bf16/f16 model copy written after the step (mixed precision only)
  Tensor main_grad{};         // [numel] view into the grad buffer
  Tensor exp_avg{}, exp_avg_sq{};  // [numel] views into the bucket's state tensors
  bool expert_parallel = false;    // of an expert buffer sharded over expert-DP (DdpOptions::expert_parallel)
};

struct DistOptStatePiece {
  std::string key;
  int64_t offset = 0;       // of the piece in the parameter's flat (TP-local) tensor
  int64_t numel = 0;
  int64_t param_numel = 0;  // numel of the parameter's flat (TP-local) tensor
  Tensor exp_avg, exp_avg_sq;  // [numel] fp32 (views of the live state)
  Tensor main_param;           // [numel] fp32 master piece with sharded masters (mixed precision); else undefined
};

// Bytes per model parameter on one rank (Megatron's distributed-optimizer table). The distributed optimizer
// shards over the data-parallel x context-parallel ranks (dp * cp).
struct MemoryReport {
  int dp = 1;
  int cp = 1;
  bool distributed_optimizer = false;
  DType model_param_dtype = DType::F32;
  double param_bytes = 0;            // model params (4 fp32, 2 bf16)
  double grad_bytes = 0;             // fp32 main grads: 4
  double main_param_bytes = 0;       // fp32 master copy, only for bf16/fp16 models: 4 (/(dp*cp) when distributed)
  double optimizer_state_bytes = 0;  // exp_avg + exp_avg_sq: 8 (/(dp*cp) when distributed)
  double total() const { return param_bytes + grad_bytes + main_param_bytes + optimizer_state_bytes; }
};
MemoryReport memory_report(int dp, bool distributed_optimizer, DType model_param_dtype, int cp = 1);
// One line, e.g. "memory per parameter per rank (dp=4, distributed optimizer, float32 params): params 4 +
// grads 4 + main params 0 + optimizer state 2 = 10 bytes" ("dp=2 x cp=2" with context parallelism).
std::string format_memory_report(const MemoryReport& r);

class DistributedOptimizer {
 public:
  // ddp must use the distributed optimizer (DdpOptions::use_distributed_optimizer); mcpp::Error otherwise.
  DistributedOptimizer(DistributedDataParallel& ddp, const DistributedOptimizerOptions& opt);
  // Several model chunks (virtual pipeline stages): every ddp must use the distributed optimizer and the
  // same data-parallel group; pieces follow the ddps' order.
  DistributedOptimizer(const std::vector<DistributedDataParallel*>& ddps, const DistributedOptimizerOptions& opt);

  // AdamW on the shard pieces (grads times grad_scale inside the update: the clip coefficient), then the
  // param all-gather (async with overlap)
  void step(float lr, float grad_scale = 1.0f);
  // step() in its two parts (the trainer times them as Megatron's optimizer-inner-step and params-all-gather):
  // the AdamW update of the shard pieces, then the all-gather of the updated shards (waited unless overlapped).
  void update_shards(float lr, float grad_scale = 1.0f);
  void gather_params();
  void wait_param_gather();  // the trainer calls it before the next forward when overlap_param_gather
  double grad_norm() const;  // global L2 norm over all grads, each element once
  double clip_grads(double total_norm, double max_norm);  // coefficient applied (1 when none)

  int64_t step_count() const { return step_; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  int64_t shard_numel() const;  // elements this rank owns (sum of pieces)
  std::vector<DistOptStatePiece> state() const;
  // For each piece, lookup(key, offset, exp_avg, exp_avg_sq) fills the [numel] tensors from a
  // checkpoint; false -> mcpp::Error naming the parameter. Sets step_count().
  using StateLookup = std::function<bool(const std::string& key, int64_t offset, Tensor& exp_avg, Tensor& exp_avg_sq)>;
  void load_state(int64_t step_count, const StateLookup& lookup);
  // Whether the fp32 masters live only in this optimizer's shards (mixed precision; each piece's `param`
  // views them: a checkpoint load writes them there, training/checkpointing.h read_model_chunks).
  bool main_params_sharded() const { return !main_param_shard_.empty(); }
  // This rank's measured bytes per parameter (state tensors actually allocated / model numel), in the
  // layout of memory_report(); differs from the formula only by bucket padding.
  MemoryReport measured_memory() const;
  // exp_avg + exp_avg_sq (+ the fp32 master shards with mixed precision) allocated on this rank (shards incl.
  // padding)
  int64_t state_bytes() const;

 private:
  void add_pieces(DistributedDataParallel& ddp);  // one ddp's buckets: state tensors + pieces
  std::vector<DistributedDataParallel*> ddps_;
  const DistributedDataParallel* dense_ = nullptr;  // the first dense wrapper (its groups: dp_cp, mp)
  bool has_expert_parallel_ = false;                // an expert wrapper here, or options.moe_model
  DistributedOptimizerOptions opt_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // per bucket (of every ddp) [shard_size]
  std::vector<Tensor> main_param_shard_;       // per bucket [shard_size] fp32 masters (mixed precision only)
  std::vector<ShardPiece> pieces_;
  int64_t step_ = 0;
};

}  // namespace mcpp
