// ops::cpu::sum_of_squares (float64, deterministic) and has_non_finite.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <omp.h>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

TEST(CpuReductions, SumOfSquaresIsFloat64AndIndependentOfThreadCount) {
  const int64_t n = 1000003;  // many 16K chunks, a partial last one
  std::vector<double> x;
  Tensor t = random_tensor({n}, 1, &x);
  double want = 0.0;
  for (double v : x) want += v * v;
  const double got = cpu::sum_of_squares(t, {});
  // Double accumulation of 1e6 terms of size <= 1: rounding ~1e6 * 1e-16 relative at worst; 1e-12.
  EXPECT_NEAR(got, want, 1e-12 * want);
  // The result must not change with the OpenMP thread count (fixed chunking, partials summed in order).
  const int prev = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    EXPECT_EQ(cpu::sum_of_squares(t, {}), got) << threads << " threads";
  }
  omp_set_num_threads(prev);
  Tensor empty = Tensor::empty({0});
  EXPECT_EQ(cpu::sum_of_squares(empty, {}), 0.0);
  Tensor bf = Tensor::zeros({4}, DType::BF16);
  EXPECT_THROW(cpu::sum_of_squares(bf, {}), Error);
}

TEST(CpuReductions, HasNonFiniteFindsNanAndInfAnywhere) {
  const int64_t n = 300000;
  Tensor t = random_tensor({n}, 2, nullptr, -1e30, 1e30);
  t.data<float>()[5] = std::numeric_limits<float>::max();  // finite
  t.data<float>()[6] = std::numeric_limits<float>::denorm_min();
  EXPECT_FALSE(cpu::has_non_finite(t, {}));
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    for (int64_t pos : {int64_t{0}, n / 2, n - 1}) {
      Tensor u = t.clone();
      u.data<float>()[pos] = bad;
      EXPECT_TRUE(cpu::has_non_finite(u, {})) << bad << " at " << pos;
    }
  }
}

}  // namespace
}  // namespace mcpp
