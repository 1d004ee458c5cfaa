// ops::cpu::dropout_fwd / dropout_bwd: the mask is philox_uniform_at(key, i) >= p (checked element by
// element against core/rng.h), the kept fraction is ~1-p, backward replays the same mask, and the
// same key gives the same mask while another key gives a different one; CUDA-graph keys (device offset
// base) are refused on the CPU; the RngTracker's graph mode.
#include <gtest/gtest.h>

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
