// Global grad-norm clipping vs torch.nn.utils.clip_grad_norm_ and a float64 norm, the no-clip
// case, the reduction hook, and non-finite norms.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/optimizer/clip_grads.h"
#include "optimizer/oracle_io.h"

namespace mcpp {
namespace {

std::vector<Tensor> make_grads(const std::vector<int64_t>& numels, float scale, std::vector<std::vector<float>>* raw) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < numels.size(); ++i) {
    auto v = test::lcg_fill(static_cast<size_t>(numels[i]), 7 + i, scale);
    Tensor t = Tensor::empty({numels[i]});
    std::copy(v.begin(), v.end(), t.data<float>());
    out.push_back(t);
    if (raw) raw->push_back(v);
  }
  return out;
}

void check_against_torch(float scale, double max_norm) {
  const std::vector<int64_t> numels = {1000, 37, 20000, 5};
  std::vector<std::vector<float>> raw;
  std::vector<Tensor> grads = make_grads(numels, scale, &raw);
  auto dir = test::fresh_dir("clip_oracle");
  test::write_json(dir / "meta.json", {{"numels", numels}, {"max_norm", max_norm}});
  for (size_t i = 0; i < raw.size(); ++i) test::write_f32(dir / ("g_" + std::to_string(i) + ".bin"), raw[i]);
  double norm = clip_grad_norm_fp32(grads, max_norm, identity_reduce);
  ASSERT_EQ(test::run_oracle("clip_oracle.py", dir.string()), 0)
      << "oracle failed (needs torch under " << test::oracle_python() << ")";
  nlohmann::json out = test::read_json(dir / "out.json");
  // float64 accumulation on both sides: agreement to rounding of the sum order
  EXPECT_NEAR(norm, out["norm64"].get<double>(), 1e-12 * out["norm64"].get<double>());
  // torch accumulates in float32: agreement to float32 rounding
  EXPECT_NEAR(norm, out["torch_norm"].get<double>(), 1e-5 * out["norm64"].get<double>());
  for (size_t i = 0; i < raw.size(); ++i) {
    auto want = test::read_f32(dir / ("out_g_" + std::to_string(i) + ".bin"));
    const float* g = grads[i].data<float>();
    for (size_t k = 0; k < want.size(); ++k)  // coefficient differs by float32 rounding of torch's norm
      ASSERT_NEAR(g[k], want[k], 2e-6f * (std::fabs(want[k]) + 1e-30f)) << "grad " << i << "[" << k << "]";
  }
  std::filesystem::remove_all(dir);
}

TEST(ClipGrads, ClipsLikeTorch) { check_against_torch(1.0f, 1.0); }      // norm ~ 84 > 1: clipped
TEST(ClipGrads, NoClipBelowMax) { check_against_torch(1e-3f, 1.0); }     // norm ~ 0.08 < 1: untouched

TEST(ClipGrads, ClipCoefficientIsMegatrons) {  // what the trainer folds into the AdamW step
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(0.5, 1.0), 1.0);        // below max_norm: none
  EXPECT_EQ(clip_coefficient(4.0, 0.0), 1.0);        // clipping off
  EXPECT_EQ(clip_coefficient(NAN, 1.0), 1.0);        // a non-finite norm skips the step elsewhere
  EXPECT_EQ(clip_coefficient(INFINITY, 1.0), 1.0);
}

TEST(ClipGrads, ReductionHookSeesLocalSumOfSquares) {
  std::vector<Tensor> grads = make_grads({10, 20}, 1.0f, nullptr);
  double local = 0.0;
  for (const Tensor& g : grads)
    for (int64_t i = 0; i < g.numel(); ++i) local += static_cast<double>(g.data<float>()[i]) * g.data<float>()[i];
  double seen = -1.0;
  // pretend 3 ranks hold identical pieces: the global sum of squares is 3 * local
  double norm = get_grad_norm_fp32(grads, [&](double x) { seen = x; return 3.0 * x; });
  EXPECT_NEAR(seen, local, 1e-12 * local);
  EXPECT_NEAR(norm, std::sqrt(3.0 * local), 1e-12 * norm);
}

TEST(ClipGrads, ZeroMaxNormOnlyMeasures) {
  std::vector<Tensor> grads = make_grads({100}, 1.0f, nullptr);
  float before = grads[0].data<float>()[3];
  double norm = clip_grad_norm_fp32(grads, 0.0, identity_reduce);
  EXPECT_GT(norm, 1.0);
  EXPECT_EQ(grads[0].data<float>()[3], before);
}

TEST(ClipGrads, NonFiniteNormLeavesGradsUntouched) {
  std::vector<Tensor> grads = make_grads({8}, 1.0f, nullptr);
  grads[0].data<float>()[2] = std::numeric_limits<float>::infinity();
  float before = grads[0].data<float>()[0];
  double norm = clip_grad_norm_fp32(grads, 1.0, identity_reduce);
  EXPECT_TRUE(std::isinf(norm));
  EXPECT_EQ(grads[0].data<float>()[0], before);
  grads[0].data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(clip_grad_norm_fp32(grads, 1.0, identity_reduce)));
  EXPECT_EQ(grads[0].data<float>()[0], before);
}

}  // namespace
}  // namespace mcpp
