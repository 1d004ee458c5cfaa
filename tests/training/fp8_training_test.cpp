// FP8 training on the CPU backend (the casts emulated: kernels/cpu/fp8.cpp; the scaling state:
// tensor_parallel/fp8_state.h): the loss of a short run follows the fp32 run's; the delayed recipe's state moves
// (scales leave their initial 1) and is saved per rank, so a run resumed from a checkpoint continues bit for bit (also
// with the first layer in bf16, --first-last-layers-bf16, which then keeps and saves no state);
// Megatron's flags are validated with one named error each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;
using training_test::error_of;
using training_test::single;
using training_test::tiny_train_config;

class Fp8TrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mcpp_fp8_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    prefix_ = training_test::make_corpus(dir_ / "data");
  }
  void TearDown() override { fs::remove_all(dir_); }
  Config fp8_config(const std::string& format, const std::string& recipe, int64_t iters) const {
    Config c = tiny_train_config(prefix_, iters);
    c.model.fp8_format = format;
    c.model.fp8_recipe = recipe;
    c.model.fp8_amax_history_len = 4;
    c.model.fp8_amax_compute_algo = "max";
    c.validate();
    return c;
  }
  fs::path dir_;
  std::string prefix_;
};

TEST_F(Fp8TrainingTest, LossFollowsTheFp32Run) {
  const int64_t iters = 30;
  Config base = tiny_train_config(prefix_, iters);
  base.training.log_interval = 10;
  const TrainSummary ref = Trainer(base, 99, single()).train();
  for (const auto& [format, recipe] : {std::pair<std::string, std::string>{"e4m3", "delayed"}, {"hybrid", "tensorwise"},
                                       {"hybrid", "delayed"}}) {
    SCOPED_TRACE(format + " " + recipe);
    Config c = fp8_config(format, recipe, iters);
    c.training.log_interval = 10;
    Trainer t(c, 99, single());
    const TrainSummary s = t.train();
    ASSERT_EQ(s.losses.size(), ref.losses.size());
    EXPECT_LT(s.losses.back(), s.losses.front() - 0.8) << "FP8 training learns the walk (fp32: 4.85 -> 3.92)";
    // FP8's per-element error (e4m3: 2^-4, e5m2 gradients: 2^-3 relative) perturbs every GEMM by a few percent, but
    // it is unbiased (round to nearest even): over 30 steps the loss stays within 1% of the fp32 run's (the issue's
    // bar; measured 2026-12-06: within 0.1% at every step, all three recipes).
    for (size_t i = 0; i < s.losses.size(); ++i)
      EXPECT_NEAR(s.losses[i], ref.losses[i], 0.01 * ref.losses[i]) << "iteration " << i + 1;
    EXPECT_NE(s.losses.back(), ref.losses.back()) << "the FP8 casts are in the path";
    // The scaling state moved away from its initial scale 1 (delayed: from the amax history; tensorwise: per call).
    int64_t scales = 0, moved = 0;
    for (const auto& [key, t8] : t.model().params().rank_states())
      if (key.ends_with(".scale")) {
        ++scales;
        moved += t8->to(Device::CPU).data<float>()[0] != 1.0f;
      }
    EXPECT_EQ(scales, 2 * 4 * 3);  // 2 layers x (qkv, proj, fc1, fc2) x (input, weight, grad_output)
    EXPECT_EQ(moved, scales);
  }
}

// Both with every layer in FP8 and with layer 0 in bf16 (--first-last-layers-bf16 --num-layers-at-start-in-bf16 1
// --num-layers-at-end-in-bf16 0: its linears keep no FP8 state, so the checkpoint holds none of it).
TEST_F(Fp8TrainingTest, ResumeIsBitExactWithTheScalingState) {
  for (const bool first_layer_bf16 : {false, true}) {
    SCOPED_TRACE(first_layer_bf16 ? "layer 0 in bf16" : "all layers FP8");
    Config full = fp8_config("hybrid", "delayed", 10);
    full.model.first_last_layers_bf16 = first_layer_bf16;
    full.model.num_layers_at_end_in_bf16 = 0;
    full.validate();
    const TrainSummary sa = Trainer(full, 99, single()).train();
    Config first = full;
    first.training.exit_interval = 5;
    first.training.save = (dir_ / (first_layer_bf16 ? "ckpt_bf16" : "ckpt")).string();
    const TrainSummary s1 = Trainer(first, 99, single()).train();
    ASSERT_EQ(s1.final_iteration, 5);
    bool saved_layer0 = false, saved_layer1 = false;  // the manifest names the per-rank FP8 state
    for (const auto& e : fs::recursive_directory_iterator(first.training.save)) {
      if (e.path().extension() != ".json") continue;
      std::ifstream f(e.path());
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      const auto names = [&text](int layer) {
        return text.find("rank_state.tp0.pp0.dp0.cp0.decoder.layers." + std::to_string(layer) +
                         ".mlp.linear_fc1.fp8.input.amax_history") != std::string::npos;
      };
      saved_layer0 = saved_layer0 || names(0);
      saved_layer1 = saved_layer1 || names(1);
    }
    EXPECT_EQ(saved_layer0, !first_layer_bf16);
    EXPECT_TRUE(saved_layer1);
    Config second = full;
    second.training.load = first.training.save;
    const TrainSummary s2 = Trainer(second, 99, single()).train();
    ASSERT_EQ(s2.iterations_run, 5);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(sa.losses[5 + i], s2.losses[i]) << "iteration " << 6 + i;  // bit for bit
    EXPECT_EQ(sa.last_valid_loss, s2.last_valid_loss);
  }
}

// --fp8-recipe blockwise (1x128 / 128x128 scales per call) on a model whose GEMM dims are multiples of 128 (h 128,
// 4 heads of 32, FFN 512, 32 tokens x micro-batch 4): the loss follows the fp32 run within 1% over 30 iterations for
// e4m3 (DeepSeek-V3's) and hybrid (the CPU trainer runs fp32 only: the bf16 comparison is the GPU test's,
// tests/cuda/fp8_block_test.cpp); the casts are in the path; no FP8 state is registered or checkpointed (the scales
// are per call), and a resume is bit-exact without it.
Config blockwise_config(const std::string& prefix, const std::string& format, int64_t iters) {
  Config c = tiny_train_config(prefix, iters);
  c.model.hidden_size = 128;
  c.model.ffn_hidden_size = 512;
  c.model.kv_channels = 32;
  c.model.seq_length = c.model.max_position_embeddings = 32;
  c.model.fp8_format = format;
  c.model.fp8_recipe = format.empty() ? "delayed" : "blockwise";
  c.validate();
  return c;
}

TEST_F(Fp8TrainingTest, BlockwiseFollowsTheFp32RunAndKeepsNoState) {
  const int64_t iters = 30;
  const TrainSummary ref = Trainer(blockwise_config(prefix_, "", iters), 99, single()).train();
  for (const std::string format : {"e4m3", "hybrid"}) {
    SCOPED_TRACE(format);
    Trainer t(blockwise_config(prefix_, format, iters), 99, single());
    const TrainSummary s = t.train();
    ASSERT_EQ(s.losses.size(), ref.losses.size());
    EXPECT_LT(s.losses.back(), s.losses.front() - 0.5) << "blockwise FP8 training learns";
    // Per-tile scales keep every element near full e4m3 precision (2^-4 relative, unbiased): within 1% of fp32 (the
    // issue's bar) at every logged step.
    double worst = 0.0;
    for (size_t i = 0; i < s.losses.size(); ++i) {
      EXPECT_NEAR(s.losses[i], ref.losses[i], 0.01 * ref.losses[i]) << "iteration " << i + 1;
      worst = std::max(worst, std::fabs(s.losses[i] - ref.losses[i]) / ref.losses[i]);
    }
    std::printf("[ measured ] blockwise %s vs fp32: worst relative loss difference %.2e over %lld steps\n",
                format.c_str(), worst, static_cast<long long>(iters));
    EXPECT_NE(s.losses.back(), ref.losses.back()) << "the FP8 casts are in the path";
    EXPECT_TRUE(t.model().params().rank_states().empty()) << "blockwise keeps no FP8 state";
  }
  // Resume: the checkpoint holds no FP8 key, and the continued run equals the straight one bit for bit.
  const Config full = blockwise_config(prefix_, "e4m3", 6);
  const TrainSummary sa = Trainer(full, 99, single()).train();
  Config first = full;
  first.training.exit_interval = 3;
  first.training.save = (dir_ / "ckpt").string();
  Trainer(first, 99, single()).train();
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "ckpt")) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.find(".fp8."), std::string::npos) << e.path();
  }
  Config second = full;
  second.training.load = first.training.save;
  const TrainSummary s2 = Trainer(second, 99, single()).train();
  ASSERT_EQ(s2.iterations_run, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sa.losses[3 + i], s2.losses[i]) << "iteration " << 4 + i;  // bit for bit
  EXPECT_EQ(sa.last_valid_loss, s2.last_valid_loss);
}

TEST_F(Fp8TrainingTest, FlagsAreValidatedWithNamedErrors) {
  auto err = [&](const std::function<void(Config&)>& edit) {
    Config c = tiny_train_config(prefix_, 10);
    edit(c);
    return error_of([&] { c.validate(); });
  };
  EXPECT_NE(err([](Config& c) { c.model.fp8_format = "e5m2"; }).find("fp8_format: unknown value 'e5m2'"),
            std::string::npos);
  EXPECT_NE(err([](Config& c) {
              c.model.fp8_format = "e4m3";
              c.model.fp8_recipe = "mxfp8";
            }).find("fp8_recipe: mxfp8 scaling is not implemented"),
            std::string::npos);
  // blockwise: every GEMM dim a multiple of 128, the first one that is not named (the tiny model: tokens 64, h 32)
  EXPECT_NE(err([](Config& c) {
              c.model.fp8_format = "e4m3";
              c.model.fp8_recipe = "blockwise";
            }).find("seq_length * micro_batch_size / context_parallel_size (the tokens of a GEMM) must be a multiple "
                    "of 128; got 64"),
            std::string::npos);
  EXPECT_NE(err([](Config& c) {
              c.model.fp8_format = "e4m3";
              c.model.fp8_recipe = "blockwise";
              c.training.micro_batch_size = 8;
            }).find("hidden_size must be a multiple of 128; got 32"),
            std::string::npos);
  EXPECT_NE(err([](Config& c) { c.model.fp8_amax_compute_algo = "mean"; }).find("fp8_amax_compute_algo"),
            std::string::npos);
  EXPECT_NE(err([](Config& c) { c.model.fp8_amax_history_len = 0; }).find("fp8_amax_history_len"), std::string::npos);
  EXPECT_NE(err([](Config& c) {
              c.model.fp8_format = "e4m3";
              c.training.device = "cuda";
            }).find("needs --bf16"),
            std::string::npos);
  // FP8 under recompute (full, and the mlp / moe / shared_experts modules) is accepted: the re-run replays the first
  // forward's scales (tests/transformer/fp8_recompute_test.cpp)
  EXPECT_EQ(err([](Config& c) {
              c.model.fp8_format = "hybrid";
              c.model.recompute_granularity = "full";
              c.model.recompute_method = "uniform";
              c.model.recompute_num_layers = 1;
            }),
            "");
  EXPECT_EQ(err([](Config& c) {
              c.model.fp8_format = "hybrid";
              c.model.recompute_granularity = "selective";
              c.model.recompute_modules = {"mlp"};
            }),
            "");
  EXPECT_EQ(err([](Config& c) { c.model.fp8_format = "hybrid"; }), "");  // CPU emulation in fp32
}

}  // namespace
}  // namespace mcpp
