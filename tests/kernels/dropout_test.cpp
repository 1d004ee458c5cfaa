// ops::cpu::dropout_fwd / dropout_bwd: the mask is philox_uniform_at(key, i) >= p (checked element by
// element against core/rng.h), the kept fraction is ~1-p, backward replays the same mask, and the
// same key gives the same mask while another key gives a different one; CUDA-graph keys (device offset
// base) are refused on the CPU; the RngTracker's graph mode. random_normal / random_scale against their
// definitions (float64 Box-Muller of the words; x times the uniform factors) and their distributions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/random.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

TEST(CpuDropout, MaskMatchesPhiloxAndKeptFractionIsOneMinusP) {
  const int64_t n = 200003;  // odd: the last 4-draw group is partial; large: the OpenMP path
  const float p = 0.1f;
  const PhiloxKey key{.seed = 1234, .offset = 77};
  std::vector<double> x;
  Tensor tx = random_tensor({n}, 1, &x, 0.5, 1.5);  // nonzero, so a zero output means dropped
  Tensor y = Tensor::empty({n});
  cpu::dropout_fwd(y, tx, p, key, {});
  int64_t kept = 0;
  const float scale = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = philox_uniform_at(key, static_cast<uint64_t>(i)) >= p;
    kept += keep;
    ASSERT_EQ(y.data<float>()[i], keep ? static_cast<float>(x[i]) * scale : 0.0f) << i;  // same fp32 ops
  }
  // Binomial(n, 0.9): sd = sqrt(n p (1-p)) ~ 134 elements; 6 sd is ~4e-3 of n.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 6.0 * std::sqrt(p * (1.0 - p) / n));

  // Backward regenerates the identical mask from the key.
  std::vector<double> dy;
  Tensor tdy = random_tensor({n}, 2, &dy, 0.5, 1.5);
  Tensor dx = Tensor::empty({n});
  cpu::dropout_bwd(dx, tdy, p, key, {});
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(dx.data<float>()[i] == 0.0f, y.data<float>()[i] == 0.0f) << "mask differs at " << i;

  // Same key -> same output (in place too); another seed or offset -> a different mask.
  Tensor again = tx.clone();
  cpu::dropout_fwd(again, again, p, key, {});
  EXPECT_EQ(to_doubles(again), to_doubles(y));
  for (PhiloxKey other : {PhiloxKey{1235, 77}, PhiloxKey{1234, 78}}) {
    Tensor z = Tensor::empty({n});
    cpu::dropout_fwd(z, tx, p, other, {});
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += (z.data<float>()[i] == 0.0f) != (y.data<float>()[i] == 0.0f);
    // Independent masks disagree on 2 p (1-p) = 18% of elements; far above 10%.
    EXPECT_GT(differ, n / 10);
  }
}

TEST(CpuDropout, BackwardIsTheGradientOfForward) {
  // dropout is linear in x for a fixed mask: d/dx sum(dy * dropout(x)) = dropout(dy).
  const int64_t n = 41;
  const float p = 0.3f;
  const PhiloxKey key{.seed = 9, .offset = 0};
  std::vector<double> x, dy;
  Tensor tx = random_tensor({n}, 3, &x), tdy = random_tensor({n}, 4, &dy);
  Tensor dx = Tensor::empty({n});
  cpu::dropout_bwd(dx, tdy, p, key, {});
  auto f = [&](const std::vector<double>& v) {
    std::vector<double> y(v.size());
    for (size_t i = 0; i < v.size(); ++i) y[i] = philox_uniform_at(key, i) >= p ? v[i] / (1.0 - p) : 0.0;
    return dot(dy, y);
  };
  EXPECT_LT(max_rel_error(dx, numeric_grad(f, x), 1e-2), 1e-6);  // fp32 scale vs double division, ~1e-7
}

TEST(CpuDropout, PZeroCopiesPOneZeroesBadPThrows) {
  Tensor x = random_tensor({10}, 5), y = Tensor::empty({10});
  cpu::dropout_fwd(y, x, 0.0f, PhiloxKey{1, 2}, {});
  EXPECT_EQ(to_doubles(y), to_doubles(x));
  cpu::dropout_fwd(y, x, 1.0f, PhiloxKey{1, 2}, {});
  EXPECT_EQ(to_doubles(y), std::vector<double>(10, 0.0));
  EXPECT_THROW(cpu::dropout_fwd(y, x, 1.5f, PhiloxKey{}, {}), Error);
  EXPECT_THROW(cpu::dropout_fwd(y, x, -0.1f, PhiloxKey{}, {}), Error);
  Tensor short_y = Tensor::empty({9});
  EXPECT_THROW(cpu::dropout_bwd(short_y, x, 0.1f, PhiloxKey{}, {}), Error);
  const uint64_t base = 4;  // a CUDA-graph key (device offset base) is refused on the CPU
  EXPECT_THROW(cpu::dropout_fwd(y, x, 0.1f, PhiloxKey{.seed = 1, .offset = 2, .device_base = &base}, {}), Error);
}

// random_normal: element i from words 2i, 2i + 1 of the key's stream (Box-Muller in float64), so a prefix of a longer
// draw is the shorter draw; the numbers are standard normal (moments and a Kolmogorov-Smirnov distance).
TEST(CpuRandom, NormalIsBoxMullerOfThePhiloxWordsAndStandardNormal) {
  const int64_t n = 100001;
  const PhiloxKey key{.seed = 77, .offset = 5};
  Tensor z = Tensor::empty({n});
  cpu::random_normal(z, key, {});
  auto word = [&](uint64_t j) { return philox4x32_10(key.seed, key.offset + j / 4, 0)[j % 4]; };
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double u1 = (static_cast<double>(word(2 * i) >> 8) + 0.5) / 16777216.0;
    const double u2 = static_cast<double>(word(2 * i + 1) >> 8) / 16777216.0;
    const float want = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
    ASSERT_EQ(z.data<float>()[i], want) << i;
    v[static_cast<size_t>(i)] = z.data<float>()[i];
  }
  double mean = 0, var = 0;
  for (double x : v) mean += x / n;
  for (double x : v) var += (x - mean) * (x - mean) / (n - 1);
  EXPECT_NEAR(mean, 0.0, 6.0 / std::sqrt(n));       // sd of the mean 1 / sqrt(n)
  EXPECT_NEAR(var, 1.0, 6.0 * std::sqrt(2.0 / n));  // sd of the variance ~ sqrt(2 / n)
  std::sort(v.begin(), v.end());
  double ks = 0;  // sup |F_n - Phi|; the 0.1% critical value is 1.95 / sqrt(n)
  for (size_t i = 0; i < v.size(); ++i) {
    const double phi = 0.5 * std::erfc(-v[i] / std::sqrt(2.0));
    ks = std::max({ks, std::abs(phi - static_cast<double>(i) / n), std::abs(phi - static_cast<double>(i + 1) / n)});
  }
  EXPECT_LT(ks, 1.95 / std::sqrt(n));
  Tensor head = Tensor::empty({3, 7});  // a shorter draw is the longer one's prefix; another offset differs
  cpu::random_normal(head, key, {});
  for (int64_t i = 0; i < 21; ++i) EXPECT_EQ(head.data<float>()[i], z.data<float>()[i]);
  cpu::random_normal(head, PhiloxKey{.seed = 77, .offset = 6}, {});
  EXPECT_NE(head.data<float>()[0], z.data<float>()[0]);
  const uint64_t base = 1;
  EXPECT_THROW(cpu::random_normal(head, PhiloxKey{.seed = 1, .device_base = &base}, {}), Error);
}

// random_scale: y = x * fma(hi - lo, u_i, lo), u_i the dropout's uniforms; factors uniform in [lo, hi); in place too.
TEST(CpuRandom, ScaleMultipliesByUniformFactorsInTheRange) {
  const int64_t n = 50001;
  const PhiloxKey key{.seed = 3, .offset = 11};
  const float lo = 0.99f, hi = 1.01f;
  Tensor x = random_tensor({n}, 21, nullptr, -2.0, 2.0), y = Tensor::empty({n}), ones = Tensor::empty({n});
  ones.fill_(1.0f);
  cpu::random_scale(y, x, lo, hi, key, {});
  Tensor f = Tensor::empty({n});
  cpu::random_scale(f, ones, lo, hi, key, {});
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float fi = std::fma(hi - lo, philox_uniform_at(key, static_cast<uint64_t>(i)), lo);
    ASSERT_EQ(f.data<float>()[i], fi) << i;
    ASSERT_EQ(y.data<float>()[i], x.data<float>()[i] * fi) << i;
    ASSERT_GE(fi, lo);
    ASSERT_LT(fi, hi);
    mean += fi / n;
  }
  EXPECT_NEAR(mean, 1.0, 6.0 * 0.02 / std::sqrt(12.0 * n));  // uniform: sd (hi - lo) / sqrt(12 n)
  Tensor again = x.clone();
  cpu::random_scale(again, again, lo, hi, key, {});
  EXPECT_EQ(to_doubles(again), to_doubles(y));
  EXPECT_THROW(cpu::random_scale(y, x, 1.1f, 1.0f, key, {}), Error);
  Tensor short_y = Tensor::empty({n - 1});
  EXPECT_THROW(cpu::random_scale(short_y, x, lo, hi, key, {}), Error);
}

// RngTracker under CUDA graphs: after begin_graph_capture, keys are relative to the offsets at that point
// and carry the device slots (default stream -> slot 0, model-parallel -> slot 1); offsets() / advance()
// keep the absolute positions a checkpoint saves.
TEST(RngTrackerGraph, KeysRelativeToTheCaptureStartWithDeviceSlots) {
  tensor_parallel::RngTracker t(1234, 1, 0);
  t.draw_default(40);         // offset 10
  t.draw_model_parallel(8);   // offset 2
  const uint64_t slots[2] = {0, 0};
  t.begin_graph_capture(slots);
  const PhiloxKey d = t.draw_default(4), m = t.draw_model_parallel(4);
  EXPECT_EQ(d.offset, 0u);
  EXPECT_EQ(d.device_base, &slots[0]);
  EXPECT_EQ(m.offset, 0u);
  EXPECT_EQ(m.device_base, &slots[1]);
  EXPECT_EQ(t.draw_default(4).offset, 1u);
  EXPECT_EQ(t.offsets()[0], 12u);
  EXPECT_EQ(t.offsets()[1], 3u);
  t.advance({5, 7});
  EXPECT_EQ(t.offsets()[0], 17u);
  EXPECT_EQ(t.state().at("model_parallel_offset").get<uint64_t>(), 10u);
}

}  // namespace
}  // namespace mcpp
