// The microbatch calculator (Megatron's num_microbatches_calculator: ConstantNumMicroBatchesCalculator and
// RampupBatchsizeNumMicroBatchesCalculator) and Config::apply_world_size (Megatron's update_train_iters); contract
// in config.h.
#include <algorithm>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/training/config.h"

namespace mcpp {

void Config::apply_world_size(int64_t world_size) {
  const int64_t mp = parallel.tensor_model_parallel_size * parallel.pipeline_model_parallel_size *
                     parallel.context_parallel_size;
  if (world_size <= 0 || world_size % mp != 0)
    fail("world size ({}) must be divisible by tensor_model_parallel_size * pipeline_model_parallel_size * "
         "context_parallel_size ({})", world_size, mp);
  parallel.data_parallel_size = world_size / mp;
  if (training.global_batch_size == 0)
    training.global_batch_size = training.micro_batch_size * parallel.data_parallel_size;
  if (training.global_batch_size % (training.micro_batch_size * parallel.data_parallel_size) != 0)
    fail("global_batch_size ({}) must be divisible by micro_batch_size * data_parallel_size ({} * {})",
         training.global_batch_size, training.micro_batch_size, parallel.data_parallel_size);
  const std::vector<int64_t>& ramp = training.rampup_batch_size;
  if (!ramp.empty()) {  // Megatron's RampupBatchsizeNumMicroBatchesCalculator asserts, as errors
    const int64_t mbs_dp = training.micro_batch_size * parallel.data_parallel_size;
    if (ramp[0] >= training.global_batch_size)
      fail("rampup_batch_size: start ({}) must be smaller than global_batch_size ({})", ramp[0],
           training.global_batch_size);
    if ((training.global_batch_size - ramp[0]) % ramp[1] != 0)
      fail("rampup_batch_size: global_batch_size - start ({} - {}) must be a multiple of the increment ({})",
           training.global_batch_size, ramp[0], ramp[1]);
    if (ramp[0] % mbs_dp != 0 || ramp[1] % mbs_dp != 0)
      fail("rampup_batch_size: start ({}) and increment ({}) must be multiples of micro_batch_size * "
           "data_parallel_size ({} * {}): every batch of the ramp is whole microbatches on every DP rank", ramp[0],
           ramp[1], training.micro_batch_size, parallel.data_parallel_size);
    if (training.enable_cuda_graph)
      fail("rampup_batch_size: the CUDA graph (--enable-cuda-graph) captures one microbatch count; not with a "
           "batch-size ramp-up");
  }
  if (training.train_samples > 0) {  // Megatron's update_train_iters
    int64_t iterations = 0, consumed = 0;
    if (!ramp.empty())  // the ramp-up: batch by batch while consumed <= ramp-up samples
      for (; consumed <= ramp[2] && consumed <= training.train_samples; ++iterations)
        consumed += global_batch_size_at(consumed);
    if (training.train_samples > consumed)  // then whole global batches (a partial last one is dropped)
      iterations += (training.train_samples - consumed) / training.global_batch_size;
    training.train_iters = iterations;
    if (training.train_iters == 0)
      fail("train_samples ({}) is smaller than global_batch_size ({}): not one iteration", training.train_samples,
           training.global_batch_size);
  }
}

int64_t Config::global_batch_size_at(int64_t consumed) const {
  const std::vector<int64_t>& ramp = training.rampup_batch_size;
  if (ramp.empty() || consumed > ramp[2]) return training.global_batch_size;
  const auto increments = static_cast<double>((training.global_batch_size - ramp[0]) / ramp[1]);
  const double per_increment = static_cast<double>(ramp[2]) / increments;  // samples per increment
  const auto steps = static_cast<int64_t>(static_cast<double>(consumed) / per_increment);
  return std::min(ramp[0] + steps * ramp[1], training.global_batch_size);
}

int64_t Config::num_microbatches_at(int64_t consumed) const {
  num_microbatches();  // the same precondition (apply_world_size)
  return global_batch_size_at(consumed) / (training.micro_batch_size * parallel.data_parallel_size);
}

int64_t Config::num_microbatches() const {
  if (parallel.data_parallel_size <= 0 || training.global_batch_size <= 0)
    fail("num_microbatches: data_parallel_size is not known yet (call apply_world_size)");
  return training.global_batch_size / (training.micro_batch_size * parallel.data_parallel_size);
}

}  // namespace mcpp
