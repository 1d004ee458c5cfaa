// ops::cpu::gemm / linear_fwd / linear_bwd against float64 references and central finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

// Row-major double GEMM: C = alpha op(A) op(B) + beta C, A stored [ra, ca], B stored [rb, cb].
std::vector<double> ref_gemm(const std::vector<double>& a, const std::vector<double>& b, std::vector<double> c,
                             int64_t m, int64_t n, int64_t k, bool ta, bool tb, double alpha, double beta) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += (ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
      c[i * n + j] = alpha * s + beta * c[i * n + j];
    }
  return c;
}

// y[n, out] = x[n, in] W[out, in]^T + bias
std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>* bias, int64_t n, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(n * out));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = bias ? (*bias)[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

TEST(CpuGemm, AllTransposesMatchFloat64) {
  const int64_t m = 37, n = 29, k = 53;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<double> a, b, c0;
      Tensor ta_t = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 1, &a);
      Tensor tb_t = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 2, &b);
      Tensor c = random_tensor({m, n}, 3, &c0);
      cpu::gemm(c, ta_t, tb_t, ops::GemmOptions{.trans_a = ta, .trans_b = tb, .alpha = 0.75f, .beta = 0.5f}, {});
      auto want = ref_gemm(a, b, c0, m, n, k, ta, tb, 0.75, 0.5);
      // Entries are sums of 53 random-sign products, magnitude ~sqrt(k)/3 ~ 2.4, but some cancel to ~0, so
      // compare against a unit floor (the terms' scale). fp32 accumulation error is ~sqrt(k) * 6e-8 * 2 ~ 1e-6.
      EXPECT_LT(max_rel_error(c, want, 1.0), 1e-5) << "trans_a=" << ta << " trans_b=" << tb;
    }
}

TEST(CpuGemm, BetaZeroIgnoresGarbageInC) {
  std::vector<double> a, b;
  Tensor ta = random_tensor({4, 6}, 4, &a), tb = random_tensor({6, 5}, 5, &b);
  Tensor c = Tensor::empty({4, 5});
  c.fill_(NAN);
  cpu::gemm(c, ta, tb, ops::GemmOptions{}, {});
  auto want = ref_gemm(a, b, std::vector<double>(20, 0.0), 4, 5, 6, false, false, 1.0, 0.0);
  EXPECT_LT(max_rel_error(c, want, 1e-2), 1e-5);  // fp32 rounding of length-6 dots
}

TEST(CpuGemm, ShapeMismatchNamesOpAndShapes) {
  Tensor a = Tensor::zeros({4, 6}), b = Tensor::zeros({5, 5}), c = Tensor::zeros({4, 5});
  try {
    cpu::gemm(c, a, b, ops::GemmOptions{}, {});
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm: inner dims differ"), std::string::npos) << e.what();
  }
  Tensor bad_c = Tensor::zeros({4, 4});
  Tensor b2 = Tensor::zeros({6, 5});
  EXPECT_THROW(cpu::gemm(bad_c, a, b2, ops::GemmOptions{}, {}), Error);
  Tensor ints = Tensor::zeros({6, 5}, DType::I32);
  EXPECT_THROW(cpu::gemm(c, a, ints, ops::GemmOptions{}, {}), Error);
}

TEST(CpuLinear, ForwardWithAndWithoutBias) {
  const int64_t s = 3, bsz = 2, in = 24, out = 17;
  std::vector<double> x, w, bias;
  Tensor tx = random_tensor({s, bsz, in}, 10, &x);
  Tensor tw = random_tensor({out, in}, 11, &w);
  Tensor tb = random_tensor({out}, 12, &bias);
  Tensor y = Tensor::empty({s, bsz, out});
  cpu::linear_fwd(y, tx, tw, &tb, {});
  // fp32 length-24 dots: ~1e-7 relative; 1e-5 with a 1e-2 floor leaves ample margin.
  EXPECT_LT(max_rel_error(y, ref_linear(x, w, &bias, s * bsz, in, out), 1e-2), 1e-5);
  cpu::linear_fwd(y, tx, tw, nullptr, {});
  EXPECT_LT(max_rel_error(y, ref_linear(x, w, nullptr, s * bsz, in, out), 1e-2), 1e-5);
  Tensor wrong = Tensor::empty({s, bsz, out + 1});
  EXPECT_THROW(cpu::linear_fwd(wrong, tx, tw, nullptr, {}), Error);
  Tensor short_bias = Tensor::zeros({out - 1});
  EXPECT_THROW(cpu::linear_fwd(y, tx, tw, &short_bias, {}), Error);
}

TEST(CpuLinear, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int64_t n = 6, in = 9, out = 7;
  std::vector<double> x, w, bias, dy, dw0, db0;
  Tensor tx = random_tensor({n, in}, 20, &x);
  Tensor tw = random_tensor({out, in}, 21, &w);
  random_vec(out, 22).swap(bias);
  Tensor tdy = random_tensor({n, out}, 23, &dy);
  Tensor dx = Tensor::empty({n, in});
  dx.fill_(123.0f);  // overwritten, not accumulated
  Tensor dw = random_tensor({out, in}, 24, &dw0);  // pre-filled: the kernel must add to it
  Tensor db = random_tensor({out}, 25, &db0);
  cpu::linear_bwd(&dx, dw, &db, tdy, tx, tw, ops::GradWrite::Accumulate, {});

  auto loss_x = [&](const std::vector<double>& xv) { return dot(dy, ref_linear(xv, w, &bias, n, in, out)); };
  auto loss_w = [&](const std::vector<double>& wv) { return dot(dy, ref_linear(x, wv, &bias, n, in, out)); };
  auto loss_b = [&](const std::vector<double>& bv) { return dot(dy, ref_linear(x, w, &bv, n, in, out)); };
  std::vector<double> want_dw = numeric_grad(loss_w, w), want_db = numeric_grad(loss_b, bias);
  for (size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += dw0[i];
  for (size_t i = 0; i < want_db.size(); ++i) want_db[i] += db0[i];
  // Linear loss: central differences are exact up to ~1e-10; the fp32 kernel's rounding (~1e-7) dominates.
  EXPECT_LT(max_rel_error(dx, numeric_grad(loss_x, x), 1e-2), 1e-5);
  EXPECT_LT(max_rel_error(dw, want_dw, 1e-2), 1e-5);
  EXPECT_LT(max_rel_error(db, want_db, 1e-2), 1e-5);

  // dx == nullptr skips the input grad; db == nullptr skips the bias grad; dw accumulates again.
  Tensor dw_before = dw.clone();
  cpu::linear_bwd(nullptr, dw, nullptr, tdy, tx, tw, ops::GradWrite::Accumulate, {});
  std::vector<double> twice = to_doubles(dw_before);
  for (size_t i = 0; i < twice.size(); ++i) twice[i] += want_dw[i] - dw0[i];
  EXPECT_LT(max_rel_error(dw, twice, 1e-2), 1e-5);  // same fp32 rounding bound as above
}

// GradWrite::Overwrite writes dw and db without reading them (the stale main grad of the step's first
// write may hold anything, NaN included): it equals Accumulate into zeros, also for an empty batch (n = 0).
TEST(CpuLinear, OverwriteEqualsAccumulatingIntoZerosAndNeverReadsTheOutputs) {
  for (int64_t n : {0, 6, 512}) {
    const int64_t in = 9, out = 300;
    Tensor tx = random_tensor({n, in}, 40), tw = random_tensor({out, in}, 41), tdy = random_tensor({n, out}, 42);
    Tensor dw_ref = Tensor::zeros({out, in}), db_ref = Tensor::zeros({out});
    cpu::linear_bwd(nullptr, dw_ref, &db_ref, tdy, tx, tw, ops::GradWrite::Accumulate, {});
    Tensor dw = Tensor::empty({out, in}), db = Tensor::empty({out});
    for (Tensor* t : {&dw, &db})
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = std::nanf("");
    cpu::linear_bwd(nullptr, dw, &db, tdy, tx, tw, ops::GradWrite::Overwrite, {});
    for (int64_t i = 0; i < dw.numel(); ++i)
      ASSERT_EQ(dw.data<float>()[i], dw_ref.data<float>()[i]) << "n " << n << " dw " << i;
    for (int64_t i = 0; i < db.numel(); ++i)
      ASSERT_EQ(db.data<float>()[i], db_ref.data<float>()[i]) << "n " << n << " db " << i;
  }
}

TEST(CpuLinear, LargeBiasGradEqualsInOrderDoubleColumnSum) {
  // Enough work to take the OpenMP path (n * out > 64K); db must equal the in-order double column sum.
  const int64_t n = 512, in = 8, out = 300;
  std::vector<double> dy;
  Tensor tx = random_tensor({n, in}, 30), tw = random_tensor({out, in}, 31), tdy = random_tensor({n, out}, 32, &dy);
  Tensor dw = Tensor::zeros({out, in}), db = Tensor::zeros({out});
  cpu::linear_bwd(nullptr, dw, &db, tdy, tx, tw, ops::GradWrite::Accumulate, {});
  for (int64_t o = 0; o < out; ++o) {
    double s = 0.0;
    for (int64_t r = 0; r < n; ++r) s += dy[r * out + o];
    EXPECT_EQ(db.data<float>()[o], static_cast<float>(s)) << "column " << o;  // exact: same double sum
  }
}

}  // namespace
}  // namespace mcpp
