// DistributedDataParallel: bucketing, per-bucket async reduction (all-reduce or reduce-scatter, Avg over
// dp_cp), grad-ready overlap, and the distributed optimizer's param all-gather. See data_parallel.h.
#include "mcpp/distributed/data_parallel.h"

#include <algorithm>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

int64_t default_bucket_size(int dp) { return std::max<int64_t>(40'000'000, 1'000'000 * int64_t{dp}); }

BufferRange Bucket::owned_range(int r, int dp) const {
  const int64_t s = shard_size(dp);
  const int64_t b = std::min(start + r * s, end), e = std::min(start + (r + 1) * s, end);
  return {b, e};
}

std::vector<Bucket> make_buckets(const ParamAndGradBuffer& buffer, int64_t bucket_size, int dp, bool pad_to_dp) {
  if (!buffer.finalized()) fail("DistributedDataParallel: the ParamAndGradBuffer must be finalized first");
  if (dp < 1) fail("DistributedDataParallel: data-parallel size must be >= 1, got {}", dp);
  if (bucket_size <= 0) bucket_size = default_bucket_size(dp);
  std::vector<Parameter*> order;
  for (const auto& p : buffer.params()) order.push_back(p.get());
  std::sort(order.begin(), order.end(), [](const Parameter* a, const Parameter* b) { return a->offset < b->offset; });
  std::vector<Bucket> out;
  Bucket cur;
  auto close = [&] {
    cur.padded_numel = pad_to_dp ? (cur.numel() + dp - 1) / dp * dp : cur.numel();
    out.push_back(std::move(cur));
    cur = Bucket{};
  };
  for (Parameter* p : order) {
    const int64_t n = p->data.numel();
    // Megatron's _does_param_require_new_bucket: a pipeline-shared embedding is alone in its bucket with
    // the distributed optimizer (same DP shard boundaries on both stages; param_and_grad_buffer.h).
    const bool alone = pad_to_dp && p->spec.shared_embedding;
    if (alone && !cur.params.empty()) close();
    if (cur.params.empty()) cur.start = cur.end = p->offset;
    MCPP_CHECK(p->offset == cur.end, "parameter '{}' at offset {} does not follow the previous one (end {})",
               p->spec.key, p->offset, cur.end);
    cur.params.push_back(p);
    cur.end = p->offset + n;
    if (alone || cur.numel() >= bucket_size) close();
  }
  if (!cur.params.empty()) close();
  return out;
}

DistributedDataParallel::DistributedDataParallel(ParamAndGradBuffer& buffer,
                                                 const parallel_state::ParallelContext& pc, const DdpOptions& opt)
    : buffer_(buffer), pc_(pc), opt_(opt), dp_(opt.expert_parallel ? pc.expert_dp() : pc.dp_cp()) {
  if (!dp_) fail("DistributedDataParallel: this rank has no {} group", opt.expert_parallel ? "expert_dp" : "dp_cp");
  if (opt.expert_parallel)
    grad_prescale_ = static_cast<float>(dp_->size()) / static_cast<float>(pc.dp_cp()->size());
  if (opt.bucket_size < 0) fail("DistributedDataParallel: ddp_bucket_size must be >= 0, got {}", opt.bucket_size);
  dp_size_ = dp_->size();
  dp_rank_ = dp_->rank();
  buckets_ = make_buckets(buffer, opt.bucket_size, dp_size_, opt.use_distributed_optimizer);
  state_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    state_[b].ready.assign(bk.params.size(), 0);
    for (size_t i = 0; i < bk.params.size(); ++i) where_[bk.params[i]] = {b, i};
    if (bk.padded_numel != bk.numel()) {
      state_[b].scratch = Tensor::zeros({bk.padded_numel}, DType::F32, buffer.grad_buffer().device());
      state_[b].param_scratch = Tensor::zeros({bk.padded_numel}, buffer.param_buffer().dtype(),
                                              buffer.param_buffer().device());
    }
  }
  if (opt.overlap_grad_reduce) {
    if (buffer.grad_ready_hook())
      fail("DistributedDataParallel: the parameter buffer already has a grad-ready hook (two DDP wrappers?)");
    buffer.set_grad_ready_hook([this](Parameter& p) { on_grad_ready(p); });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  if (opt_.overlap_grad_reduce) buffer_.set_grad_ready_hook({});
  // In-flight Works wait in their destructors (comm contract), so buffers stay valid.
}

void DistributedDataParallel::reset_readiness() {
  for (BucketState& s : state_) {
    std::fill(s.ready.begin(), s.ready.end(), 0);
    s.ready_count = 0;
    s.grad_posted = false;
  }
  next_to_post_ = 0;
}

void DistributedDataParallel::zero_grad() {
  // A reduction still in flight writes into the buffer: finish it before clearing.
  for (BucketState& s : state_) s.grad_work.wait();
  buffer_.zero_grad();
  reset_readiness();
}

void DistributedDataParallel::on_grad_ready(Parameter& p) {
  if (!is_last_microbatch_) return;  // accumulating: Megatron's no_sync
  auto it = where_.find(&p);
  if (it == where_.end())
    fail("DistributedDataParallel: parameter '{}' reported grad ready but is not in this DDP's buffer", p.spec.key);
  auto [b, i] = it->second;
  BucketState& s = state_[b];
  if (s.ready[i])
    fail("DistributedDataParallel: parameter '{}' reported grad ready twice in one backward (bucket {})",
         p.spec.key, b);
  s.ready[i] = 1;
  if (++s.ready_count == s.ready.size()) post_ready_prefix();
}

void DistributedDataParallel::post_ready_prefix() {
  while (next_to_post_ < state_.size() && state_[next_to_post_].ready_count == state_[next_to_post_].ready.size())
    post_grad_reduction(next_to_post_++);
}

void DistributedDataParallel::post_grad_reduction(size_t b) {
  const Bucket& bk = buckets_[b];
  BucketState& s = state_[b];
  if (param_gather_in_flight_)
    fail("DistributedDataParallel: gradient reduction posted while the parameter all-gather is in flight; "
         "call wait_param_gather() before the forward pass");
  Tensor grads = buffer_.grad_buffer().flat_slice(bk.start, {bk.numel()});  // [bucket numel]
  if (grad_prescale_ != 1.0f) ops::scale_inplace(grads, grad_prescale_);  // expert buffer: see DdpOptions
  if (!opt_.use_distributed_optimizer) {
    s.grad_work = dp_->all_reduce(grads, comm::ReduceOp::Avg);
  } else {
    Tensor in = grads;
    if (s.scratch.defined()) {  // [padded_numel]: real grads then zeros
      s.scratch.flat_slice(0, {bk.numel()}).copy_from(grads);
      in = s.scratch;
    }
    const int64_t shard = bk.shard_size(dp_size_);
    Tensor out = in.flat_slice(dp_rank_ * shard, {shard});  // [padded/dp], this rank's shard (in place)
    s.grad_work = dp_->reduce_scatter(out, in, comm::ReduceOp::Avg);
  }
  s.grad_posted = true;
}

void DistributedDataParallel::start_grad_sync() {
  buffer_.zero_stale_grads();  // parameters no backward wrote this step (set_overwrite_main_grad)
  for (; next_to_post_ < state_.size(); ++next_to_post_) post_grad_reduction(next_to_post_);
}

void DistributedDataParallel::finish_grad_sync() {
  if (!opt_.overlap_grad_reduce) {
    start_grad_sync();
  } else if (next_to_post_ < state_.size()) {
    const BucketState& s = state_[next_to_post_];
    const Bucket& bk = buckets_[next_to_post_];
    std::string missing;
    for (size_t i = 0; i < s.ready.size() && missing.empty(); ++i)
      if (!s.ready[i]) missing = bk.params[i]->spec.key;
    fail("DistributedDataParallel: finish_grad_sync with overlap_grad_reduce, but bucket {} was never reduced: "
         "parameter '{}' did not report grad ready during the last microbatch (is set_is_last_microbatch(true) "
         "set before the last backward?)",
         next_to_post_, missing);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = state_[b];
    s.grad_work.wait();
    if (opt_.use_distributed_optimizer && s.scratch.defined()) {
      // Copy this rank's reduced shard (its real part) back into the grad buffer.
      const Bucket& bk = buckets_[b];
      const BufferRange own = bk.owned_range(dp_rank_, dp_size_);
      if (own.numel() > 0)
        buffer_.grad_buffer().flat_slice(own.begin, {own.numel()})
            .copy_from(s.scratch.flat_slice(own.begin - bk.start, {own.numel()}));
    }
  }
  reset_readiness();
}

void DistributedDataParallel::start_param_gather() {
  if (!opt_.use_distributed_optimizer)
    fail("DistributedDataParallel: start_param_gather needs use_distributed_optimizer");
  if (param_gather_in_flight_) fail("DistributedDataParallel: start_param_gather while a gather is in flight");
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    BucketState& s = state_[b];
    Tensor params = buffer_.param_buffer().flat_slice(bk.start, {bk.numel()});  // [bucket numel]
    Tensor out = params;
    const int64_t shard = bk.shard_size(dp_size_);
    if (s.param_scratch.defined()) {  // [padded_numel]; this rank's updated shard copied into its chunk
      const BufferRange own = bk.owned_range(dp_rank_, dp_size_);
      if (own.numel() > 0)
        s.param_scratch.flat_slice(own.begin - bk.start, {own.numel()})
            .copy_from(buffer_.param_buffer().flat_slice(own.begin, {own.numel()}));
      out = s.param_scratch;
    }
    Tensor in = out.flat_slice(dp_rank_ * shard, {shard});  // in place: chunk `rank` of out
    s.param_work = dp_->all_gather(out, in);
  }
  param_gather_in_flight_ = true;
}

void DistributedDataParallel::wait_param_gather() {
  if (!param_gather_in_flight_) return;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    BucketState& s = state_[b];
    s.param_work.wait();
    if (s.param_scratch.defined()) {
      const Bucket& bk = buckets_[b];
      buffer_.param_buffer().flat_slice(bk.start, {bk.numel()}).copy_from(s.param_scratch.flat_slice(0, {bk.numel()}));
    }
  }
  param_gather_in_flight_ = false;
}

}  // namespace mcpp
