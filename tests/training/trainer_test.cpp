// Trainer: loss falls on a learnable corpus; a run resumed from a checkpoint reproduces the
// uninterrupted run bit for bit (dropout on, so the RNG state must be restored too); a checkpoint of a
// different model is refused naming the field; generation and inference loading work from a save.
#include "mcpp/training/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/datasets/indexed_dataset.h"
#include "mcpp/models/gpt/text_generation.h"
#include "training/trainer_test_util.h"

namespace mcpp {
namespace {

namespace fs = std::filesystem;
using training_test::make_corpus;
using training_test::single;
using training_test::tiny_train_config;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mcpp_trainer_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    prefix_ = make_corpus(dir_ / "data");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string prefix_;
};

TEST_F(TrainerTest, LossFalls) {
  Config c = tiny_train_config(prefix_, 60);
  c.training.log_interval = 20;
  c.training.eval_interval = 60;
  Trainer t(c, 99, single());
  TrainSummary s = t.train();
  ASSERT_EQ(s.losses.size(), 60u);
  EXPECT_GT(s.losses.front(), 4.0);                   // ~log(128) at init
  EXPECT_LT(s.losses.back(), s.losses.front() - 1.5);  // the walk is learnable
  EXPECT_GT(s.last_valid_loss, 0.0);
}

TEST_F(TrainerTest, ResumeIsBitExact) {
  // Uninterrupted: iterations 1..10.
  Config full = tiny_train_config(prefix_);
  Trainer a(full, 99, single());
  TrainSummary sa = a.train();

  // Interrupted at 5 (exit_interval), saved, then resumed to 10.
  Config first = full;
  first.training.exit_interval = 5;
  first.training.save = (dir_ / "ckpt").string();
  TrainSummary s1 = Trainer(first, 99, single()).train();
  ASSERT_EQ(s1.final_iteration, 5);
  Config second = full;
  second.training.load = (dir_ / "ckpt").string();
  TrainSummary s2 = Trainer(second, 99, single()).train();
  ASSERT_EQ(s2.iterations_run, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(sa.losses[i], s1.losses[i]) << "iteration " << i + 1;
    EXPECT_EQ(sa.losses[5 + i], s2.losses[i]) << "iteration " << 6 + i;  // bit for bit
  }
  EXPECT_EQ(sa.last_valid_loss, s2.last_valid_loss);
}

// The default (each parameter's first gradient write of a step overwrites its main grad) trains exactly
// like --no-overwrite-main-grad (the buffer zeroed at each step's start): same losses, grad norms and
// parameters after 6 steps of 2 microbatches with dropout (tied embeddings, biases, LayerNorm).
TEST_F(TrainerTest, OverwriteMainGradTrainsLikeZeroingTheBuffer) {
  TrainSummary s[2];
  std::vector<Tensor> params[2];
  for (int overwrite = 0; overwrite < 2; ++overwrite) {
    Config c = tiny_train_config(prefix_, 6);
    c.ddp.overwrite_main_grad = overwrite == 1;
    Trainer t(c, 99, single());
    s[overwrite] = t.train();
    EXPECT_EQ(t.model().params().overwrite_main_grad(), overwrite == 1);
    for (const auto& p : t.model().params().params()) params[overwrite].push_back(p->main_param.clone());
  }
  EXPECT_EQ(s[0].losses, s[1].losses);
  EXPECT_EQ(s[0].grad_norms, s[1].grad_norms);
  ASSERT_EQ(params[0].size(), params[1].size());
  for (size_t i = 0; i < params[0].size(); ++i)
    for (int64_t j = 0; j < params[0][i].numel(); ++j)
      ASSERT_EQ(params[0][i].data<float>()[j], params[1][i].data<float>()[j]) << "param " << i << " element " << j;
}

// --clip-grad reaches the update: with a huge Adam eps the AdamW step is linear in the gradient
// (lr m / (sqrt(v) + eps) ~ lr m / eps; first step: m = (1 - beta1) g, bias-corrected to g), so a run
// clipped to half its grad norm moves every parameter by Megatron's coefficient max_norm / (norm + 1e-6)
// times the unclipped run's move (the coefficient is taken inside the AdamW kernel, never as a separate
// scaling of the grads).
TEST_F(TrainerTest, ClipGradScalesTheUpdateByMegatronsCoefficient) {
  auto config = [&](float clip) {
    Config c = tiny_train_config(prefix_, 4);  // validated with 4 (warm-up 2 < decay 4), then one step run
    c.training.train_iters = 1;
    c.model.hidden_dropout = c.model.attention_dropout = 0.0f;
    c.optimizer.lr_warmup_iters = 0;
    c.optimizer.lr_decay_style = LrDecayStyle::Constant;
    c.optimizer.weight_decay = 0.0f;
    c.optimizer.adam_eps = 1e6f;  // >> |g|: the step is lr g / eps to ~1e-6
    c.optimizer.lr = 1e3f;        // moves of ~1e-3 g: well above the fp32 params' resolution
    c.optimizer.clip_grad = clip;
    c.training.eval_interval = 100;
    return c;
  };
  auto moves = [&](float clip, double* norm) {
    Trainer t(config(clip), 99, single());
    std::vector<Tensor> before;
    for (const auto& p : t.model().params().params()) before.push_back(p->data.clone());
    const TrainSummary s = t.train();
    EXPECT_EQ(s.grad_norms.size(), 1u);
    *norm = s.grad_norms.at(0);
    std::vector<double> d;
    size_t i = 0;
    for (const auto& p : t.model().params().params()) {
      const Tensor& b = before[i++];
      for (int64_t k = 0; k < b.numel(); ++k)
        d.push_back(static_cast<double>(p->data.data<float>()[k]) - b.data<float>()[k]);
    }
    return d;
  };
  double norm = 0, norm_clipped = 0;
  const std::vector<double> free = moves(0.0f, &norm);  // 0: no clipping
  ASSERT_GT(norm, 0.0);
  const auto max_norm = static_cast<float>(norm / 2);
  const std::vector<double> clipped = moves(max_norm, &norm_clipped);
  EXPECT_EQ(norm_clipped, norm);  // the same step, the norm before clipping
  const double coef = max_norm / (norm + 1e-6);
  ASSERT_EQ(free.size(), clipped.size());
  double scale = 0, worst = 0;
  for (double f : free) scale = std::max(scale, std::abs(f));
  ASSERT_GT(scale, 0.0);
  for (size_t k = 0; k < free.size(); ++k) worst = std::max(worst, std::abs(clipped[k] - coef * free[k]) / scale);
  EXPECT_LT(worst, 1e-3) << "coef " << coef;
  // and the unclipped move is not already that small (the check would pass trivially)
  double diff = 0;
  for (size_t k = 0; k < free.size(); ++k) diff = std::max(diff, std::abs(clipped[k] - free[k]) / scale);
  EXPECT_GT(diff, 0.3);
}

TEST_F(TrainerTest, NoLoadRngChangesDropoutStream) {
  Config full = tiny_train_config(prefix_);
  TrainSummary sa = Trainer(full, 99, single()).train();
  Config first = full;
  first.training.exit_interval = 5;
  first.training.save = (dir_ / "ckpt").string();
  Trainer(first, 99, single()).train();
  Config second = full;
  second.training.load = (dir_ / "ckpt").string();
  second.training.no_load_rng = true;
  TrainSummary s2 = Trainer(second, 99, single()).train();
  EXPECT_NE(sa.losses[5], s2.losses[0]);  // a fresh dropout stream gives other masks
}

TEST_F(TrainerTest, TokenOutsideTheVocabularyIsANamedError) {
  Config c = tiny_train_config(prefix_, 3);  // the corpus holds ids up to 99
  c.model.make_vocab_size_divisible_by = 1;
  c.model.set_vocab_size(64, 1);
  Trainer t(c, 99, single());
  try {
    t.train();
    ADD_FAILURE() << "training on ids >= the vocabulary did not fail";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("outside the model's vocabulary [0, 64)"), std::string::npos) << m;
    EXPECT_NE(m.find(prefix_), std::string::npos) << m;
  }
}

TEST_F(TrainerTest, CheckpointOfDifferentModelIsRefusedNamingTheField) {
  Config c = tiny_train_config(prefix_, 3);
  c.training.save = (dir_ / "ckpt").string();
  Trainer(c, 99, single()).train();
  Config other = tiny_train_config(prefix_, 3);
  other.model.hidden_size = 64;
  other.model.kv_channels = 16;
  other.training.load = (dir_ / "ckpt").string();
  try {
    Trainer t(other, 99, single());
    FAIL() << "expected the fingerprint check to refuse the checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
  }
  // --override-config-check lets it through to the tensor check, which names the tensor.
  other.training.override_config_check = true;
  EXPECT_THROW(Trainer(other, 99, single()), Error);
}

TEST_F(TrainerTest, InferenceLoadAndGenerate) {
  Config c = tiny_train_config(prefix_, 40);
  c.training.save = (dir_ / "ckpt").string();
  Trainer(c, 99, single()).train();
  LoadedModel lm = load_model_for_inference((dir_ / "ckpt").string());
  EXPECT_EQ(lm.iteration, 40);
  EXPECT_EQ(lm.config.fingerprint(), c.fingerprint());
  std::vector<int32_t> out = generate(*lm.model, {5, 16}, {.max_new_tokens = 6});
  ASSERT_EQ(out.size(), 8u);
  // After 40 iterations the greedy continuation should follow the walk t -> 3t+1 mod 97 at least once.
  int follows = 0;
  for (size_t i = 2; i < out.size(); ++i) follows += out[i] == (3 * out[i - 1] + 1) % 97;
  EXPECT_GE(follows, 1);
}

}  // namespace
}  // namespace mcpp
