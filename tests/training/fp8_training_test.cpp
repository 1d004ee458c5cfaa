// FP8 training on the CPU backend (the casts emulated: kernels/cpu/fp8.cpp; the scaling state:
// tensor_parallel/fp8_state.h): the loss of a short run follows the fp32 run's; the delayed recipe's state moves
// (scales leave their initial 1) and is saved per rank, so a run resumed from a checkpoint continues bit for bit;
// Megatron's flags are validated with one named error each.
#include <gtest/gtest.h>

#include <cmath>
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

TEST_F(Fp8TrainingTest, ResumeIsBitExactWithTheScalingState) {
  const Config full = fp8_config("hybrid", "delayed", 10);
  const TrainSummary sa = Trainer(full, 99, single()).train();
  Config first = full;
  first.training.exit_interval = 5;
  first.training.save = (dir_ / "ckpt").string();
  const TrainSummary s1 = Trainer(first, 99, single()).train();
  ASSERT_EQ(s1.final_iteration, 5);
  bool saved_state = false;  // the manifest names the per-rank FP8 state
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "ckpt")) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    saved_state = saved_state || text.find("rank_state.tp0.pp0.dp0.cp0.decoder.layers.0.mlp.linear_fc1.fp8.input."
                                           "amax_history") != std::string::npos;
  }
  EXPECT_TRUE(saved_state);
  Config second = full;
  second.training.load = first.training.save;
  const TrainSummary s2 = Trainer(second, 99, single()).train();
  ASSERT_EQ(s2.iterations_run, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sa.losses[5 + i], s2.losses[i]) << "iteration " << 6 + i;  // bit for bit
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
              c.model.fp8_recipe = "blockwise";
            }).find("fp8_recipe: blockwise scaling is not implemented"),
            std::string::npos);
  EXPECT_NE(err([](Config& c) { c.model.fp8_amax_compute_algo = "mean"; }).find("fp8_amax_compute_algo"),
            std::string::npos);
  EXPECT_NE(err([](Config& c) { c.model.fp8_amax_history_len = 0; }).find("fp8_amax_history_len"), std::string::npos);
  EXPECT_NE(err([](Config& c) {
              c.model.fp8_format = "e4m3";
              c.training.device = "cuda";
            }).find("needs --bf16"),
            std::string::npos);
  EXPECT_NE(err([](Config& c) {
              c.model.fp8_format = "hybrid";
              c.model.recompute_granularity = "full";
              c.model.recompute_method = "uniform";
              c.model.recompute_num_layers = 1;
            }).find("recompute_granularity full"),
            std::string::npos);
  EXPECT_EQ(err([](Config& c) { c.model.fp8_format = "hybrid"; }), "");  // CPU emulation in fp32
}

}  // namespace
}  // namespace mcpp
