// The distributed optimizer with mixed precision on the GPU (one rank: the shard is the whole model, the
// path is the same as at any DP): the fp32 masters live only in the optimizer's shard, and a bf16 run
// resumed from a checkpoint written from that shard continues bit for bit (--deterministic-mode); the same
// checkpoint loads into a replicated-Adam run. Multi-rank equivalence of the sharded masters:
// tests/mpi/ddp_equivalence_driver.cpp (CPU ranks, bf16 buffers) and tests/device/gpu_parallel_check.sh.
#include <filesystem>
#include <string>

#include "cuda/cuda_test_util.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

TEST(CudaDistributedOptimizer, Bf16ShardedMastersResumeBitForBit) {
  MCPP_REQUIRE_CUDA();
  const KernelSettingsScope restore;  // --deterministic-mode below changes them process-wide
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_distopt_" + std::to_string(::getpid()));
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.training.bf16 = true;
  c.model.deterministic_mode = true;
  c.parallel.use_distributed_optimizer = true;
  c.optimizer.clip_grad = 0.5f;  // clipping on: the shard's grad norm feeds the step
  c.validate();
  const TrainSummary full = training_test::expect_resume_bit_exact(c, dir / "ckpt");
  ASSERT_EQ(full.losses.size(), 8u);

  Config replicated = c;  // the checkpoint is logical: plain Adam reads the masters and moments whole
  replicated.training.load = (dir / "ckpt").string();
  replicated.parallel.use_distributed_optimizer = false;
  const TrainSummary adam = Trainer(replicated, 99, training_test::single()).train();
  ASSERT_EQ(adam.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)  // the grad norm sums in another order: not bit for bit
    EXPECT_NEAR(adam.losses[i], full.losses[4 + i], 1e-4 * full.losses[4 + i]) << "iteration " << 5 + i;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mcpp::cuda_test
