// mcpp::Adam vs torch.optim.AdamW (3 steps, changing lr, a weight-decay group and a no-weight-decay
// group), state layout for checkpoints, load_state, and constructor errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/core_test_util.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/optimizer/adam.h"
#include "optimizer/oracle_io.h"

namespace mcpp {
namespace {

Tensor from_vec(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

TEST(Adam, ThreeStepsMatchTorchAdamW) {
  struct Spec { std::string name; Shape shape; bool no_wd; };
  std::vector<Spec> specs = {{"layer.weight", {16, 8}, false}, {"layer.bias", {16}, true},
                             {"norm.weight", {8}, true}, {"out.weight", {5, 7}, false}};
  const std::vector<float> lrs = {1e-2f, 3e-3f, 5e-2f};
  const AdamOptions opt{.beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f};
  auto dir = test::fresh_dir("adam_oracle");
  nlohmann::json meta = {{"lrs", lrs}, {"beta1", opt.beta1}, {"beta2", opt.beta2}, {"eps", opt.eps},
                         {"weight_decay", opt.weight_decay}, {"params", nlohmann::json::array()}};
  std::vector<AdamParam> params;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t n = shape_numel(specs[i].shape);
    auto p0 = test::lcg_fill(static_cast<size_t>(n), 100 + i, 1.0f);
    test::write_f32(dir / ("p_" + std::to_string(i) + ".bin"), p0);
    meta["params"].push_back({{"name", specs[i].name}, {"numel", n}, {"no_weight_decay", specs[i].no_wd}});
    params.push_back(AdamParam{specs[i].name, from_vec(p0, specs[i].shape), Tensor::zeros(specs[i].shape),
                               specs[i].no_wd, {}});
  }
  test::write_json(dir / "meta.json", meta);
  Adam adam(params, opt);
  for (size_t step = 0; step < lrs.size(); ++step) {
    for (size_t i = 0; i < specs.size(); ++i) {
      // grads of different magnitudes per step, so the bias-corrected moments matter
      auto g = test::lcg_fill(static_cast<size_t>(params[i].param.numel()), 1000 * (step + 1) + i, 0.5f * (step + 1));
      test::write_f32(dir / ("g_" + std::to_string(step) + "_" + std::to_string(i) + ".bin"), g);
      std::copy(g.begin(), g.end(), params[i].main_grad.data<float>());
    }
    adam.step(lrs[step]);
  }
  EXPECT_EQ(adam.step_count(), 3);
  ASSERT_EQ(test::run_oracle("adamw_oracle.py", dir.string()), 0)
      << "oracle failed (needs torch under " << test::oracle_python() << ")";
  for (size_t i = 0; i < specs.size(); ++i) {
    auto want_p = test::read_f32(dir / ("out_p_" + std::to_string(i) + ".bin"));
    auto want_m = test::read_f32(dir / ("out_m_" + std::to_string(i) + ".bin"));
    auto want_v = test::read_f32(dir / ("out_v_" + std::to_string(i) + ".bin"));
    const AdamState& st = adam.state()[i];
    ASSERT_EQ(st.name, specs[i].name);
    ASSERT_EQ(want_p.size(), static_cast<size_t>(params[i].param.numel()));
    const float* p = params[i].param.data<float>();
    const float* m = st.exp_avg.data<float>();
    const float* v = st.exp_avg_sq.data<float>();
    for (size_t k = 0; k < want_p.size(); ++k) {
      // Same fp32 operation order as torch 1.13's single-tensor AdamW: agreement to a few ulps
      // (std::sqrt / pow rounding may differ by one ulp per step over three steps).
      EXPECT_NEAR(p[k], want_p[k], 1e-6f * (1.0f + std::fabs(want_p[k]))) << specs[i].name << "[" << k << "]";
      EXPECT_NEAR(m[k], want_m[k], 1e-6f * (1.0f + std::fabs(want_m[k]))) << specs[i].name << "[" << k << "]";
      EXPECT_NEAR(v[k], want_v[k], 1e-6f * (1.0f + std::fabs(want_v[k]))) << specs[i].name << "[" << k << "]";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(Adam, NoWeightDecayParamsAreNotDecayed) {
  // zero grads: Adam's update is 0, so only weight decay moves the params
  Tensor w = Tensor::empty({4}), b = Tensor::empty({4});
  w.fill_(2.0f);
  b.fill_(2.0f);
  Adam adam({AdamParam{"w", w, Tensor::zeros({4}), false, {}}, AdamParam{"b", b, Tensor::zeros({4}), true, {}}},
            AdamOptions{.weight_decay = 0.5f});
  adam.step(0.1f);
  EXPECT_FLOAT_EQ(w.data<float>()[0], 2.0f * (1.0f - 0.1f * 0.5f));
  EXPECT_FLOAT_EQ(b.data<float>()[0], 2.0f);
}

// The clip coefficient folded into the step (grad_scale) equals Megatron's order — scale the fp32 grads
// in place, then step — bit for bit, and leaves the grads unscaled; 1 is the plain step.
TEST(Adam, GradScaleEqualsScalingTheGradsFirst) {
  const int64_t n = 1001;
  auto filled = [&](float seed, float scale) {
    Tensor t = Tensor::empty({n});
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = scale * std::sin(seed + 0.37f * static_cast<float>(i));
    return t;
  };
  Tensor w1 = filled(1.0f, 1.0f), w2 = w1.clone(), g1 = filled(2.0f, 0.3f), g2 = g1.clone();
  Adam folded({AdamParam{"w", w1, g1, false, {}}}, AdamOptions{});
  Adam scaled({AdamParam{"w", w2, g2, false, {}}}, AdamOptions{});
  for (float coef : {0.37f, 1.0f, 0.0123f}) {
    const Tensor g_before = g1.clone();
    folded.step(1e-2f, coef);
    ops::scale_inplace(g2, coef);
    scaled.step(1e-2f);
    EXPECT_EQ(std::memcmp(w1.raw(), w2.raw(), w1.nbytes()), 0) << "coef " << coef;
    EXPECT_EQ(std::memcmp(g1.raw(), g_before.raw(), g1.nbytes()), 0) << "the grads must stay unscaled";
    std::copy(g1.data<float>(), g1.data<float>() + n, g2.data<float>());
  }
  EXPECT_THROW(folded.step(1e-2f, -1.0f), Error);
  EXPECT_THROW(folded.step(1e-2f, NAN), Error);
}

TEST(Adam, ModelParamCopyIsWritten) {
  Tensor w = Tensor::empty({3});
  w.fill_(1.0f);
  Tensor g = Tensor::empty({3});
  g.fill_(0.5f);
  Tensor model = Tensor::zeros({3}, DType::BF16);
  Adam adam({AdamParam{"w", w, g, false, model}}, AdamOptions{});
  adam.step(1e-2f);
  Tensor back = model.to(DType::F32);
  EXPECT_NEAR(back.data<float>()[0], w.data<float>()[0], 1e-2f);  // bf16 has 8 mantissa bits
  EXPECT_NE(back.data<float>()[0], 0.0f);
}

TEST(Adam, LoadStateRestoresMomentsAndStep) {
  Tensor w = Tensor::zeros({2, 3});
  Adam adam({AdamParam{"w", w, Tensor::zeros({2, 3}), false, {}}}, AdamOptions{});
  adam.load_state(7, [](const std::string& name, Tensor& m, Tensor& v) {
    EXPECT_EQ(name, "w");
    EXPECT_EQ(m.shape(), (Shape{2, 3}));
    m.fill_(0.25f);
    v.fill_(4.0f);
    return true;
  });
  EXPECT_EQ(adam.step_count(), 7);
  EXPECT_EQ(adam.state()[0].exp_avg.data<float>()[5], 0.25f);
  EXPECT_EQ(adam.state()[0].exp_avg_sq.data<float>()[0], 4.0f);
  try {
    adam.load_state(1, [](const std::string&, Tensor&, Tensor&) { return false; });
    ADD_FAILURE() << "no error for missing state";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
}

TEST(Adam, ConstructorErrorsNameTheParameter) {
  auto msg = [](std::vector<AdamParam> ps) {
    return mcpp::testing::error_of([&] { Adam a(std::move(ps), AdamOptions{}); });
  };
  EXPECT_NE(msg({AdamParam{"w", Tensor::zeros({3}), Tensor::zeros({4}), false, {}}}).find("'w'"), std::string::npos);
  EXPECT_NE(msg({AdamParam{"x", Tensor::zeros({3}), Tensor{}, false, {}}}).find("'x'"), std::string::npos);
  EXPECT_NE(msg({AdamParam{"y", Tensor::zeros({3}, DType::BF16), Tensor::zeros({3}), false, {}}}).find("'y'"),
            std::string::npos);
  EXPECT_NE(msg({AdamParam{"z", Tensor::zeros({3}), Tensor::zeros({3}), false, {}},
                 AdamParam{"z", Tensor::zeros({3}), Tensor::zeros({3}), false, {}}})
                .find("'z'"),
            std::string::npos);
}

}  // namespace
}  // namespace mcpp
