// configs/demo.toml's model (4 layers, hidden 128, 4 heads of head dim 32, learned absolute positions, LayerNorm,
// seq 128, micro batch 8) trained a few steps on CUDA equals the same training on the CPU backend (issue 35: head
// dims other than 64 / 128 on the GPU). The tokenizer is swapped for a NullTokenizer of 100 ids on a small corpus
// (trainer_test_util.h) — the model, batch and optimizer are the recipe's (its first steps: the 200-iteration
// schedule's warm-up). Runs (per-iteration losses vs the CPU):
//   fp32, the packed-qkv attention on the CUDA-core kernels at d = 32:              relative 1e-5 (fp32 ops differ
//     from the CPU's by ~1e-7 per op; six Adam steps keep it far below 1e-5)
//   bf16 (mixed precision) by default (cuDNN's fused attention) and with cuDNN off (the CUDA-core kernels on bf16
//     tensors), and in --deterministic-mode (cuDNN's deterministic backward; twice, bit for bit): relative 1e-2 vs
//     the fp32 CPU run (the suite's bf16 bound for several roundings: bf16 weights and activations)
//   fp32 with RoPE, GQA (4 heads over 2 groups) and attention dropout 0.1 on the mcpp kernels (cuDNN off: the CPU's
//     Philox mask in-tile): relative 1e-5.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/training/arguments.h"
#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

constexpr int64_t kIters = 6;

// The recipe from the working directory (the device scripts run from the repo root) or the source tree.
std::string demo_toml() {
  const std::string local = "configs/demo.toml";
  return std::filesystem::exists(local) ? local : std::string(MCPP_SOURCE_DIR) + "/" + local;
}

std::vector<double> train_demo(const std::string& corpus, const std::string& device,
                               const std::vector<std::string>& extra) {
  std::vector<std::string> args{"--config", demo_toml(), "--data-path",
                                corpus, "--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--train-iters",
                                std::to_string(kIters), "--lr-decay-iters", "200", "--eval-iters", "0", "--log-interval", "1", "--device", device};
  args.insert(args.end(), extra.begin(), extra.end());
  Config c = parse_train_args(args);
  c.apply_world_size(1);
  c.model.set_vocab_size(100, 1);  // as `mcpp train` applies the NullTokenizer (its EOD 99: the corpus's)
  c.validate();
  EXPECT_EQ(c.model.kv_channels, 32) << "demo.toml's head dim";
  const TrainSummary s = Trainer(c, 99, training_test::single()).train();
  EXPECT_EQ(static_cast<int64_t>(s.losses.size()), kIters);
  return s.losses;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * want[i]) << what << ", iteration " << i + 1;
}

struct Corpus {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("mcpp_hd_" + std::to_string(::getpid()));
  std::string prefix = training_test::make_corpus(dir);
  ~Corpus() { std::filesystem::remove_all(dir); }
};

TEST(CudaHeadDimTraining, DemoRecipeTrainsLikeTheCpu) {
  MCPP_REQUIRE_CUDA();
  const KernelSettingsScope restore;  // --deterministic-mode changes them process-wide
  const Corpus corpus;
  const std::vector<double> cpu = train_demo(corpus.prefix, "cpu", {});
  for (double l : cpu) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(cpu.back(), cpu.front()) << "the recipe learns";
  const auto c0 = ops::cuda_cudnn_attention_counts();
  expect_close(train_demo(corpus.prefix, "cuda", {}), cpu, 1e-5, "fp32 (CUDA-core kernels, d 32)");
  EXPECT_EQ(ops::cuda_cudnn_attention_counts().fwd, c0.fwd) << "fp32 never takes cuDNN";
  expect_close(train_demo(corpus.prefix, "cuda", {"--bf16"}), cpu, 1e-2, "bf16 (default: cuDNN)");
  {
    const CudnnAttentionScope mcpp_kernels(false);
    const auto c1 = ops::cuda_cudnn_attention_counts();
    expect_close(train_demo(corpus.prefix, "cuda", {"--bf16"}), cpu, 1e-2, "bf16 (cuDNN off: CUDA-core kernels)");
    EXPECT_EQ(ops::cuda_cudnn_attention_counts().fwd, c1.fwd) << "cuDNN switched off, yet it ran";
  }
  const std::vector<double> det = train_demo(corpus.prefix, "cuda", {"--bf16", "--deterministic-mode"});
  expect_close(det, cpu, 1e-2, "bf16 deterministic");
  const std::vector<double> det2 = train_demo(corpus.prefix, "cuda", {"--bf16", "--deterministic-mode"});
  for (size_t i = 0; i < det.size(); ++i) EXPECT_EQ(det[i], det2[i]) << "deterministic rerun, iteration " << i + 1;
}

TEST(CudaHeadDimTraining, DemoRecipeWithRopeGqaAndDropoutTrainsLikeTheCpu) {
  MCPP_REQUIRE_CUDA();
  const Corpus corpus;
  const CudnnAttentionScope mcpp_kernels(false);  // the CPU's attention dropout mask
  const std::vector<std::string> variant{"--position-embedding-type", "rope", "--group-query-attention",
                                         "--num-query-groups", "2", "--attention-dropout", "0.1"};
  const std::vector<double> cpu = train_demo(corpus.prefix, "cpu", variant);
  expect_close(train_demo(corpus.prefix, "cuda", variant), cpu, 1e-5, "fp32 rope + GQA + attention dropout");
}

}  // namespace
}  // namespace mcpp::cuda_test
