// DistributedOptimizer: AdamW on this rank's shard pieces, shard grad norm / clip, logical state, memory
// report. See distributed_optimizer.h for the contract.
#include "mcpp/optimizer/distributed_optimizer.h"

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

MemoryReport memory_report(int dp, bool distributed_optimizer, DType model_param_dtype, int cp) {
  if (dp < 1) fail("memory_report: data-parallel size must be >= 1, got {}", dp);
  if (cp < 1) fail("memory_report: context-parallel size must be >= 1, got {}", cp);
  if (model_param_dtype != DType::F32 && model_param_dtype != DType::BF16 && model_param_dtype != DType::F16)
    fail("memory_report: model params must be float32, bfloat16 or float16, got {}", dtype_name(model_param_dtype));
  MemoryReport r{.dp = dp, .cp = cp, .distributed_optimizer = distributed_optimizer,
                 .model_param_dtype = model_param_dtype};
  const double shard = distributed_optimizer ? 1.0 / (dp * cp) : 1.0;
  r.param_bytes = static_cast<double>(dtype_size(model_param_dtype));
  r.grad_bytes = 4;
  r.main_param_bytes = model_param_dtype == DType::F32 ? 0.0 : 4.0 * shard;
  r.optimizer_state_bytes = 8.0 * shard;
  return r;
}

std::string format_memory_report(const MemoryReport& r) {
  return fmt::format(
      "memory per parameter per rank (dp={}{}, {}, {} params): params {:g} + grads {:g} + main params {:g} + "
      "optimizer state {:g} = {:g} bytes",
      r.dp, r.cp > 1 ? fmt::format(" x cp={}", r.cp) : "",
      r.distributed_optimizer ? "distributed optimizer" : "replicated optimizer", dtype_name(r.model_param_dtype), r.param_bytes, r.grad_bytes, r.main_param_bytes, r.optimizer_state_bytes,
      r.total());
}

DistributedOptimizer::DistributedOptimizer(DistributedDataParallel& ddp, const DistributedOptimizerOptions& opt)
    : DistributedOptimizer(std::vector<DistributedDataParallel*>{&ddp}, opt) {}

DistributedOptimizer::DistributedOptimizer(const std::vector<DistributedDataParallel*>& ddps,
                                           const DistributedOptimizerOptions& opt)
    : ddps_(ddps), opt_(opt) {
  if (ddps_.empty()) fail("DistributedOptimizer: no DistributedDataParallel wrapper given");
  const DistributedDataParallel* expert = nullptr;
  for (const DistributedDataParallel* d : ddps_) {
    if (!d->options().use_distributed_optimizer)
      fail("DistributedOptimizer: the DistributedDataParallel wrapper must be built with use_distributed_optimizer");
    const bool ex = d->options().expert_parallel;  // MoE experts under EP: sharded over expert-DP instead
    const DistributedDataParallel*& ref = ex ? expert : dense_;
    if (!ref) ref = d;
    else if (d->dp_group() != ref->dp_group())
      fail("DistributedOptimizer: the model chunks' DistributedDataParallel wrappers use different {} groups",
           ex ? "expert-DP" : "DP");
  }
  if (!dense_) fail("DistributedOptimizer: no DistributedDataParallel wrapper of dense (non-expert) parameters given");
  has_expert_parallel_ = expert != nullptr || opt.moe_model;
  const AdamOptions& a = opt.adam;
  if (!(a.beta1 >= 0.0f && a.beta1 < 1.0f)) fail("DistributedOptimizer: adam_beta1 must be in [0, 1), got {}", a.beta1);
  if (!(a.beta2 >= 0.0f && a.beta2 < 1.0f)) fail("DistributedOptimizer: adam_beta2 must be in [0, 1), got {}", a.beta2);
  if (!(a.eps > 0.0f)) fail("DistributedOptimizer: adam_eps must be positive, got {}", a.eps);
  if (!(a.weight_decay >= 0.0f)) fail("DistributedOptimizer: weight_decay must be >= 0, got {}", a.weight_decay);
  for (DistributedDataParallel* d : ddps_) add_pieces(*d);
  // Mixed precision: all chunks use the model's dtype, so either every bucket has a master shard or none.
  MCPP_CHECK(main_param_shard_.empty() || main_param_shard_.size() == exp_avg_.size(),
             "DistributedOptimizer: model chunks mix fp32 and low-precision params");
}

void DistributedOptimizer::add_pieces(DistributedDataParallel& ddp) {
  const int dp = ddp.dp_size(), r = ddp.dp_rank();
  ParamAndGradBuffer& buf = ddp.buffer();
  const Device dev = buf.param_buffer().device();
  const bool mixed = buf.mixed_precision();
  if (mixed && !buf.has_main_params())
    fail("DistributedOptimizer: the model chunk's fp32 main params were already released to another optimizer");
  for (const Bucket& bk : ddp.buckets()) {
    const int64_t shard = bk.shard_size(dp);
    exp_avg_.push_back(Tensor::zeros({shard}, DType::F32, dev));     // [padded/dp]
    exp_avg_sq_.push_back(Tensor::zeros({shard}, DType::F32, dev));  // [padded/dp]
    if (mixed) main_param_shard_.push_back(Tensor::zeros({shard}, DType::F32, dev));  // [padded/dp]
    const BufferRange own = bk.owned_range(r, dp);
    const int64_t shard_begin = bk.start + r * shard;  // buffer offset of state element 0
    for (Parameter* p : bk.params) {
      const int64_t b = std::max(own.begin, p->offset), e = std::min(own.end, p->offset + p->data.numel());
      if (b >= e) continue;
      ShardPiece piece{.owner = p, .buffer_offset = b, .param_offset = b - p->offset, .numel = e - b,
                       .expert_parallel = ddp.options().expert_parallel};
      if (mixed) {  // this rank's masters, copied from the buffer's (about to be freed) whole copy
        piece.param = main_param_shard_.back().flat_slice(b - shard_begin, {e - b});
        piece.param.copy_from(buf.main_param_buffer().flat_slice(b, {e - b}));
        piece.model_param = buf.param_buffer().flat_slice(b, {e - b});
      } else {
        piece.param = buf.main_param_buffer().flat_slice(b, {e - b});
      }
      piece.main_grad = buf.grad_buffer().flat_slice(b, {e - b});
      piece.exp_avg = exp_avg_.back().flat_slice(b - shard_begin, {e - b});
      piece.exp_avg_sq = exp_avg_sq_.back().flat_slice(b - shard_begin, {e - b});
      pieces_.push_back(std::move(piece));
    }
  }
  if (mixed) buf.release_main_params();  // 4 bytes a parameter -> 4 / dp
}

void DistributedOptimizer::step(float lr, float grad_scale) {
  update_shards(lr, grad_scale);
  gather_params();
}

void DistributedOptimizer::update_shards(float lr, float grad_scale) {
  wait_param_gather();  // a previous overlapped gather must land before the shard is rewritten
  ++step_;
  std::vector<ops::AdamWTensors> list;  // one multi-tensor step over the pieces (= adamw_step per piece)
  list.reserve(pieces_.size());
  for (const ShardPiece& pc : pieces_)
    list.push_back(ops::AdamWTensors{.param = pc.param, .exp_avg = pc.exp_avg, .exp_avg_sq = pc.exp_avg_sq,
                                     .grad = pc.main_grad, .param_model = pc.model_param,
                                     .weight_decay = pc.owner->spec.no_weight_decay ? 0.0f : opt_.adam.weight_decay});
  ops::adamw_multi_step(list, ops::AdamWOptions{.lr = lr, .beta1 = opt_.adam.beta1, .beta2 = opt_.adam.beta2,
                                                .eps = opt_.adam.eps, .step = step_, .grad_scale = grad_scale});
}

void DistributedOptimizer::gather_params() {
  for (DistributedDataParallel* d : ddps_) d->start_param_gather();
  if (!opt_.overlap_param_gather) wait_param_gather();
}

void DistributedOptimizer::wait_param_gather() {
  for (DistributedDataParallel* d : ddps_) d->wait_param_gather();
}

double DistributedOptimizer::grad_norm() const {
  const DistributedDataParallel& ddp = *dense_;
  const parallel_state::ParallelContext& pc = ddp.parallel_context();
  double dense = 0, expert = 0;
  for (const ShardPiece& p : pieces_)
    if (p.expert_parallel) {  // each expert-TP shard once
      if (counts_in_grad_norm(p.owner->spec, pc.expert_tp_rank())) expert += ops::sum_of_squares(p.main_grad);
    } else if (counts_in_grad_norm(p.owner->spec, pc.tp_rank())) dense += ops::sum_of_squares(p.main_grad);
  // float32 values (the communicator has no float64); rounding ~1e-7 relative, as model_grad_norm. Dense shards
  // sum over dp_cp; expert shards (under EP, over expert-DP) over expert-DP, then over expert-TP and EP.
  auto host_sum = [](const comm::CommPtr& g, double v) {
    if (!g || g->size() == 1) return v;
    Tensor t = Tensor::empty({1}, DType::F32);
    t.data<float>()[0] = static_cast<float>(v);
    g->host().all_reduce(t, comm::ReduceOp::Sum).wait();
    return static_cast<double>(t.data<float>()[0]);
  };
  const double dense_sum = host_sum(pc.mp(), host_sum(ddp.dp_group(), dense));
  if (!has_expert_parallel_) return std::sqrt(dense_sum);
  const double experts = host_sum(pc.ep(), host_sum(pc.expert_tp(), host_sum(pc.expert_dp(), expert)));
  return std::sqrt(dense_sum + host_sum(pc.pp(), experts));
}

double DistributedOptimizer::clip_grads(double total_norm, double max_norm) {
  const double coef = clip_coefficient(total_norm, max_norm);
  if (coef >= 1.0) return 1.0;
  for (ShardPiece& p : pieces_) ops::scale_inplace(p.main_grad, static_cast<float>(coef));
  return coef;
}

int64_t DistributedOptimizer::shard_numel() const {
  int64_t n = 0;
  for (const ShardPiece& p : pieces_) n += p.numel;
  return n;
}

std::vector<DistOptStatePiece> DistributedOptimizer::state() const {
  std::vector<DistOptStatePiece> out;
  out.reserve(pieces_.size());
  for (const ShardPiece& p : pieces_)
    out.push_back({.key = p.owner->spec.key, .offset = p.param_offset, .numel = p.numel,
                   .param_numel = p.owner->data.numel(), .exp_avg = p.exp_avg, .exp_avg_sq = p.exp_avg_sq,
                   .main_param = main_params_sharded() ? p.param : Tensor()});
  return out;
}

void DistributedOptimizer::load_state(int64_t step_count, const StateLookup& lookup) {
  if (step_count < 0) fail("DistributedOptimizer: step count in the checkpoint must be >= 0, got {}", step_count);
  for (ShardPiece& p : pieces_)
    if (!lookup(p.owner->spec.key, p.param_offset, p.exp_avg, p.exp_avg_sq))
      fail("DistributedOptimizer: the checkpoint has no optimizer state for '{}' elements [{}, {})",
           p.owner->spec.key, p.param_offset, p.param_offset + p.numel);
  step_ = step_count;
}

int64_t DistributedOptimizer::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < exp_avg_.size(); ++i) b += static_cast<int64_t>(exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes());
  for (const Tensor& t : main_param_shard_) b += static_cast<int64_t>(t.nbytes());
  return b;
}

MemoryReport DistributedOptimizer::measured_memory() const {
  double n = 0, param_bytes = 0, grad_bytes = 0;
  for (DistributedDataParallel* d : ddps_) {
    n += static_cast<double>(d->buffer().numel());
    param_bytes += static_cast<double>(d->buffer().param_buffer().nbytes());
    grad_bytes += static_cast<double>(d->buffer().grad_buffer().nbytes());
  }
  const parallel_state::ParallelContext& pc = dense_->parallel_context();  // shards over dp x cp ranks
  MemoryReport r{.dp = pc.dp_size(), .cp = pc.cp_size(), .distributed_optimizer = true,
                 .model_param_dtype = ddps_.front()->buffer().param_buffer().dtype()};
  r.param_bytes = param_bytes / n;
  r.grad_bytes = grad_bytes / n;
  double masters = 0;
  for (const Tensor& t : main_param_shard_) masters += static_cast<double>(t.nbytes());
  r.main_param_bytes = masters / n;
  r.optimizer_state_bytes = (static_cast<double>(state_bytes()) - masters) / n;
  return r;
}

}  // namespace mcpp
