// Megatron's learning-rate schedule: every decay style (and each WSD anneal) at many steps vs an
// independent Python statement of Megatron's get_lr (tests/oracle/optimizer/megatron_lr.py), a few
// values worked by hand, Megatron's sample units in from_config, state dict round trip and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/optimizer/lr_scheduler.h"
#include "mcpp/training/config.h"
#include "optimizer/oracle_io.h"

namespace mcpp {
namespace {

// The trainer's call: the optimizer config and the training's batch and unit.
OptimizerParamScheduler scheduler_of(const Config& c) {
  return OptimizerParamScheduler::from_config(c.optimizer, c.training.global_batch_size, c.training.train_samples > 0);
}

TEST(LrScheduler, MatchesMegatronFormulaAtManySteps) {
  struct Case { LrSchedulerOptions opt; };
  auto make = [](LrDecayStyle style, double warmup, double decay, std::string wsd = "exponential",
                 double wsd_steps = 0.0, double init_lr = 0.0) {
    LrSchedulerOptions o;
    o.max_lr = 3e-3;
    o.min_lr = 2e-4;
    o.init_lr = init_lr;
    o.warmup_steps = warmup;
    o.decay_steps = decay;
    o.decay_style = style;
    o.wsd_decay_style = std::move(wsd);
    o.wsd_decay_steps = wsd_steps;
    return o;
  };
  std::vector<LrSchedulerOptions> cases = {
      make(LrDecayStyle::Linear, 80, 800),
      make(LrDecayStyle::Cosine, 80, 800),
      make(LrDecayStyle::Cosine, 0, 800),
      make(LrDecayStyle::Cosine, 12.5, 800, "exponential", 0, 1e-4),  // fractional warmup, init_lr
      make(LrDecayStyle::Constant, 80, 800),
      make(LrDecayStyle::InverseSquareRoot, 80, 800),
      make(LrDecayStyle::InverseSquareRoot, 0, 800),
      make(LrDecayStyle::WSD, 80, 800, "exponential", 200),
      make(LrDecayStyle::WSD, 80, 800, "linear", 200),
      make(LrDecayStyle::WSD, 80, 800, "cosine", 200),
      make(LrDecayStyle::WSD, 80, 800, "minus_sqrt", 800),
  };
  std::vector<int64_t> steps;
  for (int64_t n = 0; n <= 840; n += 3) steps.push_back(n);
  for (int64_t n : {1, 2, 79, 80, 81, 599, 600, 601, 799, 800, 801, 5000}) steps.push_back(n);
  nlohmann::json in = nlohmann::json::array();
  for (const auto& o : cases)
    in.push_back({{"max_lr", o.max_lr}, {"min_lr", o.min_lr}, {"init_lr", o.init_lr},
                  {"warmup_steps", o.warmup_steps}, {"decay_steps", o.decay_steps},
                  {"style", to_string(o.decay_style)}, {"wsd_decay_steps", o.wsd_decay_steps},
                  {"wsd_style", o.wsd_decay_style}, {"steps", steps}});
  auto dir = test::fresh_dir("lr_oracle");
  test::write_json(dir / "in.json", in);
  ASSERT_EQ(test::run_oracle("megatron_lr.py", (dir / "in.json").string() + " " + (dir / "out.json").string()), 0);
  nlohmann::json want = test::read_json(dir / "out.json");
  for (size_t c = 0; c < cases.size(); ++c) {
    OptimizerParamScheduler s(cases[c]);
    for (size_t k = 0; k < steps.size(); ++k) {
      double w = want[c][k].get<double>();
      // both sides evaluate the same double formula with the same libm; allow last-bit differences
      EXPECT_NEAR(s.lr_at(steps[k]), w, 1e-13 * std::max(1.0, std::fabs(w)))
          << "case " << c << " (" << to_string(cases[c].decay_style) << "/" << cases[c].wsd_decay_style
          << ") step " << steps[k];
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(LrScheduler, HandWorkedValues) {
  LrSchedulerOptions o;
  o.max_lr = 1e-3;
  o.min_lr = 1e-4;
  o.warmup_steps = 10;
  o.decay_steps = 110;
  o.decay_style = LrDecayStyle::Cosine;
  OptimizerParamScheduler s(o);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);        // warmup starts at init_lr = 0
  EXPECT_DOUBLE_EQ(s.lr_at(5), 5e-4);       // halfway up
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);      // top
  EXPECT_DOUBLE_EQ(s.lr_at(60), 5.5e-4);    // halfway down: (max + min) / 2
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);     // end of decay
  EXPECT_DOUBLE_EQ(s.lr_at(111), 1e-4);     // past it: min_lr
  o.decay_style = LrDecayStyle::Linear;
  EXPECT_DOUBLE_EQ(OptimizerParamScheduler(o).lr_at(35), 1e-4 + 0.75 * 9e-4);
  o.decay_style = LrDecayStyle::InverseSquareRoot;
  EXPECT_DOUBLE_EQ(OptimizerParamScheduler(o).lr_at(40), 1e-3 * std::sqrt(10.0) / std::sqrt(40.0));
  o.decay_style = LrDecayStyle::WSD;
  o.wsd_decay_steps = 20;
  o.wsd_decay_style = "linear";
  EXPECT_DOUBLE_EQ(OptimizerParamScheduler(o).lr_at(90), 1e-3);          // stable phase
  EXPECT_DOUBLE_EQ(OptimizerParamScheduler(o).lr_at(100), 5.5e-4);       // half the anneal
  o.wsd_decay_style = "exponential";
  EXPECT_DOUBLE_EQ(OptimizerParamScheduler(o).lr_at(110), 1e-4);         // 2 * 0.5 - 1 = 0
}

TEST(LrScheduler, FromConfigUsesMegatronSampleUnits) {
  Config c;
  c.training.train_iters = 100;
  c.training.micro_batch_size = 2;
  c.training.global_batch_size = 8;
  c.optimizer.lr = 1e-3f;
  c.optimizer.min_lr = 1e-4f;
  c.optimizer.lr_warmup_iters = 4;
  c.optimizer.lr_decay_style = LrDecayStyle::Linear;
  c.finalize();
  c.validate();
  c.apply_world_size(1);
  OptimizerParamScheduler s = scheduler_of(c);
  EXPECT_DOUBLE_EQ(s.options().warmup_steps, 32.0);
  EXPECT_DOUBLE_EQ(s.options().decay_steps, 800.0);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.0);  // iteration 1 trains with lr 0, as in Megatron
  s.step(8);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.25 * static_cast<double>(1e-3f));
  // fraction: 0.1 * 800 samples = 80 samples = 10 iterations
  c.optimizer.lr_warmup_iters = 0;
  c.optimizer.lr_warmup_fraction = 0.1f;
  EXPECT_NEAR(scheduler_of(c).options().warmup_steps, 80.0, 1e-4);
  Config unknown_gbs;
  unknown_gbs.finalize();
  EXPECT_THROW(scheduler_of(unknown_gbs), Error);
}

// Sample-based training: the lengths are the *_samples themselves (a warmup of 30 samples is not a whole number of
// batches of 8), and a sample-based schedule whose lengths are whole batches equals the iteration-based one at every
// step (Megatron counts samples in both).
TEST(LrScheduler, FromConfigSampleBased) {
  Config c;
  c.training.train_samples = 1000;
  c.training.micro_batch_size = 2;
  c.training.global_batch_size = 8;
  c.optimizer.lr = 1e-3f;
  c.optimizer.min_lr = 1e-4f;
  c.optimizer.lr_warmup_samples = 30;
  c.optimizer.lr_decay_style = LrDecayStyle::Linear;
  c.finalize();
  c.validate();
  c.apply_world_size(1);
  EXPECT_EQ(c.training.train_iters, 125);
  OptimizerParamScheduler s = scheduler_of(c);
  EXPECT_DOUBLE_EQ(s.options().warmup_steps, 30.0);
  EXPECT_DOUBLE_EQ(s.options().decay_steps, 1000.0);
  const double lr = static_cast<double>(1e-3f), min_lr = static_cast<double>(1e-4f);
  EXPECT_DOUBLE_EQ(s.lr_at(24), lr * 24.0 / 30.0);  // iteration 4 still warms up
  EXPECT_DOUBLE_EQ(s.lr_at(32), min_lr + (lr - min_lr) * (1.0 - 2.0 / 970.0));
  c.optimizer.lr_warmup_samples = 0;
  c.optimizer.lr_warmup_fraction = 0.05f;  // of the decay samples
  EXPECT_NEAR(scheduler_of(c).options().warmup_steps, 50.0, 1e-4);

  for (const LrDecayStyle style : {LrDecayStyle::Cosine, LrDecayStyle::WSD, LrDecayStyle::InverseSquareRoot}) {
    Config it, sa;
    for (Config* k : {&it, &sa}) {
      k->training.micro_batch_size = 2;
      k->training.global_batch_size = 8;
      k->optimizer.lr = 1e-3f;
      k->optimizer.min_lr = 1e-5f;
      k->optimizer.lr_decay_style = style;
    }
    it.training.train_iters = 50;
    it.optimizer.lr_warmup_iters = 5;
    it.optimizer.lr_decay_iters = 40;
    it.optimizer.lr_wsd_decay_iters = style == LrDecayStyle::WSD ? 10 : 0;
    sa.training.train_samples = 400;
    sa.optimizer.lr_warmup_samples = 40;
    sa.optimizer.lr_decay_samples = 320;
    sa.optimizer.lr_wsd_decay_samples = style == LrDecayStyle::WSD ? 80 : 0;
    for (Config* k : {&it, &sa}) {
      k->finalize();
      k->validate();
      k->apply_world_size(1);
    }
    EXPECT_EQ(sa.training.train_iters, it.training.train_iters);
    const OptimizerParamScheduler a = scheduler_of(it);
    const OptimizerParamScheduler b = scheduler_of(sa);
    for (int64_t n = 0; n <= 400; n += 8) EXPECT_EQ(a.lr_at(n), b.lr_at(n)) << "step " << n;
  }
}

TEST(LrScheduler, StateDictRoundTripAndMismatch) {
  LrSchedulerOptions o;
  o.max_lr = 1e-3;
  o.warmup_steps = 10;
  o.decay_steps = 100;
  OptimizerParamScheduler a(o);
  a.step(37);
  nlohmann::json sd = nlohmann::json::parse(a.state_dict().dump());
  OptimizerParamScheduler b(o);
  b.load_state_dict(sd);
  EXPECT_EQ(b.num_steps(), 37);
  EXPECT_DOUBLE_EQ(b.get_lr(), a.get_lr());
  LrSchedulerOptions other = o;
  other.max_lr = 2e-3;
  OptimizerParamScheduler c(other);
  try {
    c.load_state_dict(sd);
    ADD_FAILURE() << "no error for a different max_lr";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_lr"), std::string::npos) << e.what();
  }
}

TEST(LrScheduler, ConstructorChecksMegatronAsserts) {
  LrSchedulerOptions o;
  o.warmup_steps = 100;
  o.decay_steps = 100;
  EXPECT_THROW(OptimizerParamScheduler{o}, Error);  // warmup must be < decay
  o.warmup_steps = 0;
  o.min_lr = 1.0;
  EXPECT_THROW(OptimizerParamScheduler{o}, Error);  // min_lr > max_lr
  o.min_lr = 0.0;
  o.decay_style = LrDecayStyle::WSD;
  EXPECT_THROW(OptimizerParamScheduler{o}, Error);  // WSD without anneal length
  o.wsd_decay_steps = 10;
  o.wsd_decay_style = "step";
  EXPECT_THROW(OptimizerParamScheduler{o}, Error);
}

}  // namespace
}  // namespace mcpp
