// ops::cpu::rope_fwd / rope_bwd (non-interleaved rotate_half) against a float64 reference, finite
// differences of L = sum(dy * rope(x)), and in-place use (y aliasing x). The fused qkv_split_rope against a float64
// split of Megatron's fused QKV rows + rotation, and qkv_merge_rope as its transpose.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

// x[s, b, heads, d]; cos/sin [s, half]. The HF formula: y = x * cos_full + rotate_half(x) * sin_full on
// the first 2*half dims, where rotate_half(x) = [-x2, x1] and cos_full = [cos, cos].
std::vector<double> ref_rope(const std::vector<double>& x, const std::vector<double>& cos,
                             const std::vector<double>& sin, int64_t s, int64_t bh, int64_t d, int64_t half) {
  std::vector<double> y = x;
  for (int64_t p = 0; p < s; ++p)
    for (int64_t j = 0; j < bh; ++j) {
      const double* xr = &x[(p * bh + j) * d];
      double* yr = &y[(p * bh + j) * d];
      for (int64_t i = 0; i < 2 * half; ++i) {
        const double rot = i < half ? -xr[i + half] : xr[i - half];
        yr[i] = xr[i] * cos[p * half + i % half] + rot * sin[p * half + i % half];
      }
    }
  return y;
}

struct Tables {
  Tensor cos, sin;
  std::vector<double> c, s;
};
// Megatron's frequencies: theta_i = 10000^(-2i/rot), angle = pos * theta_i.
Tables make_tables(int64_t s, int64_t half) {
  Tables t{Tensor::empty({s, half}), Tensor::empty({s, half}), {}, {}};
  for (int64_t p = 0; p < s; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / (2.0 * half));
      t.cos.data<float>()[p * half + i] = static_cast<float>(std::cos(a));
      t.sin.data<float>()[p * half + i] = static_cast<float>(std::sin(a));
    }
  t.c = to_doubles(t.cos);
  t.s = to_doubles(t.sin);
  return t;
}

TEST(CpuRope, ForwardBackwardMatchFloat64AndFiniteDifferences) {
  const int64_t s = 5, b = 2, heads = 3, d = 10;
  for (int64_t half : {5, 3}) {  // full rotation, and partial rotary dims (dims 6..9 pass through)
    SCOPED_TRACE(::testing::Message() << "half=" << half);
    Tables t = make_tables(s, half);
    std::vector<double> x, dy;
    Tensor tx = random_tensor({s, b, heads, d}, 7, &x), tdy = random_tensor({s, b, heads, d}, 8, &dy);
    Tensor y = Tensor::empty({s, b, heads, d}), dx = Tensor::empty({s, b, heads, d});
    cpu::rope_fwd(y, tx, t.cos, t.sin, {});
    // fp32: two products and a sum per element, absolute error ~2e-7 of the terms' scale (|x| <= 1); the
    // sum can cancel, so compare against a unit floor: 1e-6.
    EXPECT_LT(max_rel_error(y, ref_rope(x, t.c, t.s, s, b * heads, d, half), 1.0), 1e-6);
    cpu::rope_bwd(dx, tdy, t.cos, t.sin, {});
    auto want = numeric_grad([&](const std::vector<double>& v) { return dot(dy, ref_rope(v, t.c, t.s, s, b * heads, d, half)); }, x);
    EXPECT_LT(max_rel_error(dx, want, 1.0), 1e-6);  // linear map: FD exact to ~1e-10; fp32 as above
  }
}

TEST(CpuRope, InPlaceEqualsOutOfPlaceAndBackwardInvertsForward) {
  const int64_t s = 4, b = 3, heads = 2, d = 8;
  Tables t = make_tables(s, 3);
  Tensor x = random_tensor({s, b, heads, d}, 9);
  Tensor y = Tensor::empty({s, b, heads, d});
  cpu::rope_fwd(y, x, t.cos, t.sin, {});
  Tensor inplace = x.clone();
  cpu::rope_fwd(inplace, inplace, t.cos, t.sin, {});
  EXPECT_EQ(to_doubles(inplace), to_doubles(y));  // same arithmetic per element
  // The rotation is orthogonal, so bwd (its transpose) undoes fwd up to fp32 rounding.
  cpu::rope_bwd(inplace, inplace, t.cos, t.sin, {});
  EXPECT_LT(max_rel_error(inplace, to_doubles(x), 1.0), 1e-6);
}

TEST(CpuRope, RejectsBadTables) {
  Tensor x = Tensor::zeros({4, 1, 2, 8}), y = Tensor::zeros({4, 1, 2, 8});
  Tensor too_wide = Tensor::zeros({4, 5}), wrong_s = Tensor::zeros({3, 4}), ok = Tensor::zeros({4, 4});
  try {
    cpu::rope_fwd(y, x, too_wide, too_wide, {});
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_fwd: rotary dim"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu::rope_fwd(y, x, wrong_s, wrong_s, {}), Error);
  EXPECT_THROW(cpu::rope_fwd(y, x, ok, wrong_s, {}), Error);
  Tensor flat = Tensor::zeros({4, 16});
  EXPECT_THROW(cpu::rope_bwd(flat, flat, ok, ok, {}), Error);
}

// qkv_split_rope on Megatron's fused rows qkv[s, b, ng * (r + 2) * d] (per group [q_0 .. q_{r-1}, k, v]): q and k
// equal the float64 rotation of their rows, v the copy (MHA, GQA, partial rotary); qkv_merge_rope is its transpose:
// <merge_rope(dq, dk, dv), qkv> = <dq, q> + <dk, k> + <dv, v> for the split's q, k, v.
TEST(CpuRope, FusedSplitAndMergeOnTheQkvLayout) {
  const int64_t s = 5, b = 2, d = 8;
  for (const auto& [nq, ng, half] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 2, 4}, {4, 1, 4},
                                                                                      {6, 2, 2}}) {
    SCOPED_TRACE(::testing::Message() << "nq=" << nq << " ng=" << ng << " half=" << half);
    const int64_t r = nq / ng;
    Tables t = make_tables(s, half);
    std::vector<double> x;
    Tensor qkv = random_tensor({s, b, ng * (r + 2) * d}, 21, &x);
    Tensor q = Tensor::empty({s, b, nq, d}), k = Tensor::empty({s, b, ng, d}), v = Tensor::empty({s, b, ng, d});
    cpu::qkv_split_rope(q, k, v, qkv, t.cos, t.sin, {});
    std::vector<double> wq(q.numel()), wk(k.numel()), wv(v.numel());  // the rows, in float64
    for (int64_t tok = 0; tok < s * b; ++tok)
      for (int64_t g = 0; g < ng; ++g)
        for (int64_t j = 0; j < r + 2; ++j)
          for (int64_t e = 0; e < d; ++e) {
            const double val = x[((tok * ng + g) * (r + 2) + j) * d + e];
            if (j < r) wq[((tok * nq) + g * r + j) * d + e] = val;
            else (j == r ? wk : wv)[(tok * ng + g) * d + e] = val;
          }
    EXPECT_LT(max_rel_error(q, ref_rope(wq, t.c, t.s, s, b * nq, d, half), 1.0), 1e-6);
    EXPECT_LT(max_rel_error(k, ref_rope(wk, t.c, t.s, s, b * ng, d, half), 1.0), 1e-6);
    EXPECT_EQ(to_doubles(v), wv);
    std::vector<double> dq, dk, dv;
    Tensor tdq = random_tensor(q.shape(), 22, &dq), tdk = random_tensor(k.shape(), 23, &dk);
    Tensor tdv = random_tensor(v.shape(), 24, &dv);
    Tensor dqkv = Tensor::empty(qkv.shape());
    cpu::qkv_merge_rope(dqkv, tdq, tdk, tdv, t.cos, t.sin, {});
    const double lhs = dot(to_doubles(dqkv), x);
    const double rhs = dot(dq, to_doubles(q)) + dot(dk, to_doubles(k)) + dot(dv, to_doubles(v));
    EXPECT_NEAR(lhs, rhs, 1e-5 * (std::abs(rhs) + 1.0));
  }
  Tensor qkv = Tensor::zeros({4, 1, 4 * 8}), q = Tensor::zeros({4, 1, 2, 8}), k = Tensor::zeros({4, 1, 1, 8});
  Tensor v = Tensor::zeros({4, 1, 1, 8}), wide = Tensor::zeros({4, 5});
  try {
    cpu::qkv_split_rope(q, k, v, qkv, wide, wide, {});
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rotary dim"), std::string::npos) << e.what();
  }
  Tensor short_qkv = Tensor::zeros({4, 1, 3 * 8}), ok = Tensor::zeros({4, 4});
  EXPECT_THROW(cpu::qkv_merge_rope(short_qkv, q, k, v, ok, ok, {}), Error);
}

}  // namespace
}  // namespace mcpp
