// DistributedDataParallel (Megatron-Core distributed/distributed_data_parallel.py with its
// _ParamAndGradBucketGroup): gradient reduction over the data-parallel (x context-parallel) group, per
// bucket of the contiguous main-grad buffer.
//
// Buckets: contiguous ranges of ParamAndGradBuffer's grad (and param) buffer, in backward order (offset 0
// = the last registered parameter, whose gradient is ready first). Walking the parameters by offset, a
// bucket closes after the parameter that makes it reach bucket_size elements (Megatron's
// _ParamAndGradBuffer rule), so bucket boundaries are parameter boundaries and no parameter straddles
// two buckets. bucket_size 0 -> Megatron's default max(40'000'000, 1'000'000 * dp).
// With the distributed optimizer every bucket is padded to a multiple of dp (padded_numel), so each DP
// rank owns an equal shard of shard_size = padded_numel / dp elements: rank r owns bucket elements
// [r*shard_size, (r+1)*shard_size) intersected with the bucket's real elements (owned_range). The
// buffer itself is not padded (param_and_grad_buffer.h is laid out densely); a bucket whose numel is not
// a multiple of dp gets private padded copies (fp32 grads, params in their dtype) that the collectives run on.
//
// Gradient reduction (ReduceOp::Avg over pc.dp_cp(), i.e. Megatron's 1/dp scaling; the trainer divides
// each microbatch loss by the local number of microbatches, so the result is the mean over the global
// batch):
//   plain DDP:            all_reduce(bucket grads)            every rank holds the full reduced grads
//   distributed optimizer: reduce_scatter(bucket grads)       only owned_range holds reduced grads; the
//                                                             rest of the grad buffer is left partial
// start_grad_sync() posts every bucket's collective not yet posted (async, in bucket order);
// finish_grad_sync() waits for all of them (posting them first without overlap_grad_reduce).
// overlap_grad_reduce: the constructor installs the buffer's grad-ready hook (Parameter::grad_ready);
// during the LAST microbatch of a step (set_is_last_microbatch(true), Megatron's no_sync inverse) a
// bucket's collective is posted as soon as all its parameters reported ready and all earlier buckets are
// posted (so every rank posts in one order). Reports during other microbatches are ignored: no
// collective runs before the last microbatch's backward. A parameter reporting twice in one last
// microbatch, or a bucket not complete at finish_grad_sync, is an mcpp::Error naming the parameter.
//
// Parameter all-gather (distributed optimizer, after the optimizer updated each rank's owned_range of
// the param buffer): start_param_gather() posts one async all_gather per bucket; wait_param_gather()
// waits and copies padded results back. Until it returns, the param buffer outside this rank's shards
// holds the previous step's values: call it before the next forward (and before eval / saving).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "mcpp/comm/communicator.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/parallel_state/parallel_context.h"

namespace mcpp {

struct DdpOptions {
  int64_t bucket_size = 0;  // elements; 0 -> max(40'000'000, 1'000'000 * dp)
  bool overlap_grad_reduce = false;
  bool use_distributed_optimizer = false;
  // The model's expert buffer (moe/; ParamSpec::expert) under expert parallelism: reduced over pc.expert_dp()
  // instead of dp_cp, each bucket scaled by expert_dp / (dp * cp) before the Avg — Megatron's expert gradient
  // scaling: an expert's grad already sums over the tokens of its whole EP group, so the result is the mean over
  // the dp * cp data-parallel ranks like every other gradient.
  bool expert_parallel = false;
};

// A range [begin, end) of buffer elements.
struct BufferRange {
  int64_t begin = 0, end = 0;
  int64_t numel() const { return end - begin; }
};

struct Bucket {
  int64_t start = 0, end = 0;         // [start, end) in the grad / param buffer (elements)
  int64_t padded_numel = 0;           // end - start rounded up to a multiple of dp (dist. optimizer)
  std::vector<Parameter*> params;     // backward order (ascending offset)
  int64_t numel() const { return end - start; }
  int64_t shard_size(int dp) const { return padded_numel / dp; }
  // The buffer elements DP rank r owns: bucket elements [r*shard, (r+1)*shard) within the real ones
  // (empty, begin == end, when r's shard is all padding).
  BufferRange owned_range(int r, int dp) const;
};

// Megatron's bucketing over `buffer` (finalized): see the contract above. pad_to_dp: pad each bucket to a
// multiple of dp (distributed optimizer); otherwise padded_numel == numel. bucket_size <= 0 -> default.
std::vector<Bucket> make_buckets(const ParamAndGradBuffer& buffer, int64_t bucket_size, int dp, bool pad_to_dp);
int64_t default_bucket_size(int dp);  // max(40'000'000, 1'000'000 * dp)

class DistributedDataParallel {
 public:
  // Buckets over `buffer` (finalized) for the dp_cp group of `pc`. Installs the grad-ready hook when
  // opt.overlap_grad_reduce (the buffer must have no hook yet); the destructor removes it.
  DistributedDataParallel(ParamAndGradBuffer& buffer, const parallel_state::ParallelContext& pc,
                          const DdpOptions& opt);
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Megatron's no_sync(): false while accumulating earlier microbatches, true for the last one. Default
  // true (one microbatch per step).
  void set_is_last_microbatch(bool last) { is_last_microbatch_ = last; }
  bool is_last_microbatch() const { return is_last_microbatch_; }

  void zero_grad();        // zero the main-grad buffer and forget readiness (start of a step)
  void start_grad_sync();  // post every bucket's reduction not yet posted
  void finish_grad_sync(); // wait for all (posting first without overlap); then grads are final

  void start_param_gather();  // distributed optimizer only: async all-gather of every bucket's params
  void wait_param_gather();   // waits; no-op when nothing is in flight
  bool param_gather_in_flight() const { return param_gather_in_flight_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const DdpOptions& options() const { return opt_; }
  int dp_size() const { return dp_size_; }
  int dp_rank() const { return dp_rank_; }
  const comm::CommPtr& dp_group() const { return dp_; }
  ParamAndGradBuffer& buffer() { return buffer_; }
  const parallel_state::ParallelContext& parallel_context() const { return pc_; }

 private:
  struct BucketState {
    Tensor scratch;        // padded fp32 grads (dist. optimizer, numel % dp != 0); undefined otherwise
    Tensor param_scratch;  // the same for the param all-gather, in the param dtype (bf16 with mixed precision)
    std::vector<char> ready;  // per param of the bucket, during the last microbatch
    size_t ready_count = 0;
    bool grad_posted = false;
    comm::Work grad_work;
    comm::Work param_work;
  };
  void on_grad_ready(Parameter& p);
  void post_ready_prefix();   // post buckets in order while complete
  void post_grad_reduction(size_t b);
  void reset_readiness();

  ParamAndGradBuffer& buffer_;
  parallel_state::ParallelContext pc_;  // a value: shares the group communicators
  DdpOptions opt_;
  comm::CommPtr dp_;
  int dp_size_ = 1, dp_rank_ = 0;
  float grad_prescale_ = 1.0f;  // expert_parallel: expert_dp / (dp * cp)
  std::vector<Bucket> buckets_;
  std::vector<BucketState> state_;
  std::unordered_map<const Parameter*, std::pair<size_t, size_t>> where_;  // param -> (bucket, index)
  size_t next_to_post_ = 0;
  bool is_last_microbatch_ = true;
  bool param_gather_in_flight_ = false;
};

}  // namespace mcpp
