// Tests for ops::cpu::cross_entropy_fwd / _bwd: loss and lse vs float64 (including logits offset by
// 1000, where a naive exp overflows), backward vs the float64 analytic gradient and central finite
// differences, in-place (dlogits aliasing logits), and the error naming an out-of-range target.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

struct CeRef {
  std::vector<double> loss, lse;
};

CeRef ce_ref(const std::vector<double>& x, const std::vector<int32_t>& t, int64_t n, int64_t V) {
  CeRef r{std::vector<double>(n), std::vector<double>(n)};
  for (int64_t i = 0; i < n; ++i) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[i * V + j]);
    for (int64_t j = 0; j < V; ++j) sum += std::exp(x[i * V + j] - mx);
    r.lse[i] = mx + std::log(sum);
    r.loss[i] = r.lse[i] - x[i * V + t[i]];
  }
  return r;
}

Tensor targets_tensor(const std::vector<int32_t>& t) {
  Tensor out = Tensor::empty({static_cast<int64_t>(t.size())}, DType::I32);
  std::copy(t.begin(), t.end(), out.data<int32_t>());
  return out;
}

std::vector<int32_t> random_targets(int64_t n, int64_t V, uint64_t seed) {
  std::vector<double> u = testing::random_vec(n, seed, 0.0, 1.0);
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(u[i] * static_cast<double>(V));
  return t;
}

TEST(CrossEntropyCpu, ForwardMatchesFloat64) {
  for (double offset : {0.0, 1000.0})
    for (int64_t V : {1, 7, 50304}) {
      SCOPED_TRACE("V=" + std::to_string(V) + " offset=" + std::to_string(offset));
      const int64_t n = 6;
      std::vector<double> xs;
      Tensor x = testing::random_tensor({n, V}, 31, &xs, offset - 8.0, offset + 8.0);
      const std::vector<int32_t> t = random_targets(n, V, 32);
      Tensor loss = Tensor::empty({n}), lse = Tensor::empty({n});
      ops::cpu::cross_entropy_fwd(loss, lse, x, targets_tensor(t), {});
      CeRef want = ce_ref(xs, t, n, V);
      // lse ~ offset + log V: fp32 stores it to ~6e-8 relative (6e-5 at 1000); the loss is a difference of
      // two such numbers, so its absolute error follows the lse magnitude.
      const double tol = 1e-6 * (offset + 20.0);
      EXPECT_LT(testing::max_abs_error(testing::to_doubles(lse), want.lse), tol);
      EXPECT_LT(testing::max_abs_error(testing::to_doubles(loss), want.loss), tol);
    }
}

TEST(CrossEntropyCpu, BackwardMatchesAnalyticAndFiniteDifferences) {
  const int64_t n = 4, V = 11;
  std::vector<double> xs, dls;
  Tensor x = testing::random_tensor({n, V}, 41, &xs, -3.0, 3.0);
  Tensor dloss = testing::random_tensor({n}, 42, &dls);
  const std::vector<int32_t> t = random_targets(n, V, 43);
  Tensor tt = targets_tensor(t);
  Tensor loss = Tensor::empty({n}), lse = Tensor::empty({n}), dx = Tensor::empty({n, V});
  ops::cpu::cross_entropy_fwd(loss, lse, x, tt, {});
  dx.fill_(NAN);  // overwritten
  ops::cpu::cross_entropy_bwd(dx, dloss, x, tt, lse, {});
  const std::vector<double> fd = testing::numeric_grad(
      [&](const std::vector<double>& v) { return testing::dot(dls, ce_ref(v, t, n, V).loss); }, xs);
  CeRef r = ce_ref(xs, t, n, V);
  std::vector<double> analytic(xs.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < V; ++j)
      analytic[i * V + j] = (std::exp(xs[i * V + j] - r.lse[i]) - (j == t[i] ? 1.0 : 0.0)) * dls[i];
  // Grads in [-1, 1]; fp32 exp and lse rounding: 1e-6 absolute. FD error ~1e-9.
  EXPECT_LT(testing::max_abs_error(testing::to_doubles(dx), analytic), 1e-6);
  EXPECT_LT(testing::max_abs_error(testing::to_doubles(dx), fd), 1e-6);
}

TEST(CrossEntropyCpu, BackwardInPlaceMatchesOutOfPlace) {
  const int64_t n = 5, V = 50304;
  Tensor x = testing::random_tensor({n, V}, 51, nullptr, -5.0, 5.0);
  Tensor dloss = testing::random_tensor({n}, 52);
  Tensor tt = targets_tensor(random_targets(n, V, 53));
  Tensor loss = Tensor::empty({n}), lse = Tensor::empty({n}), dx = Tensor::empty({n, V});
  ops::cpu::cross_entropy_fwd(loss, lse, x, tt, {});
  ops::cpu::cross_entropy_bwd(dx, dloss, x, tt, lse, {});
  ops::cpu::cross_entropy_bwd(x, dloss, x, tt, lse, {});  // dlogits aliases logits
  EXPECT_EQ(testing::to_doubles(x), testing::to_doubles(dx));
}

TEST(CrossEntropyCpu, RejectsTargetOutsideVocab) {
  Tensor x = Tensor::zeros({4, 10}), loss = Tensor::empty({4}), lse = Tensor::empty({4});
  for (int32_t bad : {10, -1}) {
    Tensor tt = targets_tensor({1, 2, 3, 4});
    tt.data<int32_t>()[2] = bad;
    try {
      ops::cpu::cross_entropy_fwd(loss, lse, x, tt, {});
      FAIL() << "target " << bad << " must be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("targets[2] = " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  Tensor wrong = Tensor::zeros({3}, DType::I32);
  EXPECT_THROW(ops::cpu::cross_entropy_fwd(loss, lse, x, wrong, {}), Error);
}

}  // namespace
}  // namespace mcpp
