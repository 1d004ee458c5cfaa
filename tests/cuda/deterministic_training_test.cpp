// --deterministic-mode on the GPU: two bf16 GPT trainings from the same seed give the same losses bit for
// bit (GEMM autotuning off, the mcpp attention kernels instead of cuDNN's, the ordered embedding backward;
// every other op of the step is deterministic by construction).
#include <filesystem>
#include <string>

#include "cuda/cuda_test_util.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

TEST(CudaDeterministicMode, Bf16TrainingRepeatsBitForBit) {
  MCPP_REQUIRE_CUDA();
  const KernelSettingsScope restore;  // --deterministic-mode below changes them process-wide
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_det_" + std::to_string(::getpid()));
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.training.bf16 = true;
  c.model.deterministic_mode = true;
  c.validate();
  const TrainSummary a = Trainer(c, 99, training_test::single()).train();
  EXPECT_TRUE(ops::cuda::deterministic_kernels()) << "the Trainer applies --deterministic-mode";
  EXPECT_FALSE(ops::cuda::gemm_autotune());
  const TrainSummary b = Trainer(c, 99, training_test::single()).train();
  std::filesystem::remove_all(dir);
  ASSERT_EQ(a.losses.size(), 8u);
  for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_EQ(a.losses[i], b.losses[i]) << "iteration " << i + 1;
  EXPECT_EQ(a.last_valid_loss, b.last_valid_loss);
}

}  // namespace
}  // namespace mcpp::cuda_test
