// ops::cpu::layernorm_* / rmsnorm_* against float64 references (forward, saved stats) and central finite
// differences of L = sum(dy * norm(x, gamma, beta)) (backward, including += into dgamma/dbeta).
#include <gtest/gtest.h>

#include <cmath>

#include <omp.h>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;
constexpr double kEps = 1e-5;

// rms == false: LayerNorm (beta may be empty); rms == true: RMSNorm (beta ignored).
std::vector<double> ref_norm(const std::vector<double>& x, const std::vector<double>& gamma,
                             const std::vector<double>& beta, int64_t n, int64_t h, bool rms,
                             std::vector<double>* mean = nullptr, std::vector<double>* rstd = nullptr) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < n; ++r) {
    double mu = 0.0, var = 0.0;
    if (!rms) {
      for (int64_t c = 0; c < h; ++c) mu += x[r * h + c];
      mu /= h;
    }
    for (int64_t c = 0; c < h; ++c) var += (x[r * h + c] - mu) * (x[r * h + c] - mu);
    const double rs = 1.0 / std::sqrt(var / h + kEps);
    for (int64_t c = 0; c < h; ++c)
      y[r * h + c] = (x[r * h + c] - mu) * rs * gamma[c] + (!rms && !beta.empty() ? beta[c] : 0.0);
    if (mean) mean->push_back(mu);
    if (rstd) rstd->push_back(rs);
  }
  return y;
}

struct NormCase {
  int64_t n, h;
  bool rms, with_beta;
};

void check_norm(const NormCase& k, bool finite_differences) {
  SCOPED_TRACE(::testing::Message() << "n=" << k.n << " h=" << k.h << " rms=" << k.rms << " beta=" << k.with_beta);
  std::vector<double> x, gamma, beta, dy, dg0, db0;
  Tensor tx = random_tensor({k.n, k.h}, 100 + k.h, &x, -2.0, 3.0);  // nonzero mean exercises centering
  Tensor tg = random_tensor({k.h}, 200, &gamma, 0.5, 1.5);
  Tensor tb = random_tensor({k.h}, 300, &beta);
  if (!k.with_beta || k.rms) beta.clear();
  Tensor tdy = random_tensor({k.n, k.h}, 400, &dy);
  Tensor y = Tensor::empty({k.n, k.h}), mean = Tensor::empty({k.n}), rstd = Tensor::empty({k.n});
  if (k.rms) cpu::rmsnorm_fwd(y, rstd, tx, tg, static_cast<float>(kEps), {});
  else cpu::layernorm_fwd(y, mean, rstd, tx, tg, k.with_beta ? &tb : nullptr, static_cast<float>(kEps), {});
  std::vector<double> want_mean, want_rstd;
  auto want_y = ref_norm(x, gamma, beta, k.n, k.h, k.rms, &want_mean, &want_rstd);
  // Forward: double statistics, one fp32 rounding of the output (6e-8); 1e-6 with a 1e-3 floor.
  EXPECT_LT(max_rel_error(y, want_y, 1e-3), 1e-6);
  EXPECT_LT(max_rel_error(rstd, want_rstd), 1e-6);  // fp32 rounding of a double value
  if (!k.rms) {
    EXPECT_LT(max_rel_error(mean, want_mean), 1e-6);
  }

  Tensor dx = Tensor::empty({k.n, k.h});
  dx.fill_(-7.0f);  // overwritten
  Tensor dgamma = random_tensor({k.h}, 500, &dg0), dbeta = random_tensor({k.h}, 600, &db0);  // += targets
  if (k.rms) cpu::rmsnorm_bwd(dx, dgamma, tdy, tx, tg, rstd, {});
  else cpu::layernorm_bwd(dx, dgamma, k.with_beta ? &dbeta : nullptr, tdy, tx, tg, mean, rstd, {});

  std::vector<double> want_dx, want_dg, want_db;
  if (finite_differences) {
    want_dx = numeric_grad([&](const std::vector<double>& v) { return dot(dy, ref_norm(v, gamma, beta, k.n, k.h, k.rms)); }, x);
    want_dg = numeric_grad([&](const std::vector<double>& v) { return dot(dy, ref_norm(x, v, beta, k.n, k.h, k.rms)); }, gamma);
    if (!beta.empty())
      want_db = numeric_grad([&](const std::vector<double>& v) { return dot(dy, ref_norm(x, gamma, v, k.n, k.h, k.rms)); }, beta);
  } else {  // large shapes: the closed-form gradient in double (finite differences would be O((n h)^2))
    want_dx.resize(x.size());
    want_dg.assign(static_cast<size_t>(k.h), 0.0);
    want_db.assign(static_cast<size_t>(k.h), 0.0);
    for (int64_t r = 0; r < k.n; ++r) {
      const double mu = k.rms ? 0.0 : want_mean[r], rs = want_rstd[r];
      double sg = 0.0, sgx = 0.0;
      for (int64_t c = 0; c < k.h; ++c) {
        const double xh = (x[r * k.h + c] - mu) * rs, g = dy[r * k.h + c] * gamma[c];
        sg += g, sgx += g * xh;
        want_dg[c] += dy[r * k.h + c] * xh;
        want_db[c] += dy[r * k.h + c];
      }
      for (int64_t c = 0; c < k.h; ++c) {
        const double xh = (x[r * k.h + c] - mu) * rs, g = dy[r * k.h + c] * gamma[c];
        want_dx[r * k.h + c] = rs * (g - (k.rms ? 0.0 : sg / k.h) - xh * sgx / k.h);
      }
    }
    if (beta.empty()) want_db.clear();
  }
  for (size_t c = 0; c < want_dg.size(); ++c) want_dg[c] += dg0[c];
  for (size_t c = 0; c < want_db.size(); ++c) want_db[c] += db0[c];
  // Backward runs in double from the fp32-rounded saved mean/rstd (relative 6e-8 each, amplified by the
  // centering cancellation to ~1e-6 of the terms' scale); 2e-5 against a 1e-2 floor covers it with margin.
  EXPECT_LT(max_rel_error(dx, want_dx, 1e-2), 2e-5);
  EXPECT_LT(max_rel_error(dgamma, want_dg, 1e-2), 2e-5);
  if (!want_db.empty()) EXPECT_LT(max_rel_error(dbeta, want_db, 1e-2), 2e-5);
  else EXPECT_EQ(to_doubles(dbeta), db0);  // dbeta not passed: untouched
}

TEST(CpuNorms, LayerNormMatchesFloat64AndFiniteDifferences) {
  check_norm({.n = 5, .h = 12, .rms = false, .with_beta = true}, true);
  check_norm({.n = 3, .h = 70, .rms = false, .with_beta = false}, true);  // h not a multiple of the 64-col block
}

TEST(CpuNorms, RMSNormMatchesFloat64AndFiniteDifferences) {
  check_norm({.n = 5, .h = 12, .rms = true, .with_beta = false}, true);
  check_norm({.n = 3, .h = 70, .rms = true, .with_beta = false}, true);
}

TEST(CpuNorms, LargeShapesTakeTheParallelPathAndMatchClosedForm) {
  check_norm({.n = 300, .h = 200, .rms = false, .with_beta = true}, false);
  check_norm({.n = 300, .h = 200, .rms = true, .with_beta = false}, false);
}

TEST(CpuNorms, BackwardIsBitwiseIndependentOfThreadCount) {
  // dgamma/dbeta sum over rows in a fixed order per column block; dx is per row: no thread-count effect.
  const int64_t n = 512, h = 192;
  Tensor x = random_tensor({n, h}, 1), g = random_tensor({h}, 2), b = random_tensor({h}, 3), dy = random_tensor({n, h}, 4);
  Tensor y = Tensor::empty({n, h}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
  cpu::layernorm_fwd(y, mean, rstd, x, g, &b, 1e-5f, {});
  std::vector<std::vector<double>> runs;
  const int prev = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Tensor dx = Tensor::empty({n, h}), dg = Tensor::zeros({h}), db = Tensor::zeros({h}), dr = Tensor::zeros({h});
    cpu::layernorm_bwd(dx, dg, &db, dy, x, g, mean, rstd, {});
    cpu::rmsnorm_bwd(dx, dr, dy, x, g, rstd, {});
    std::vector<double> all = to_doubles(dx);
    for (const Tensor* t : {&dg, &db, &dr}) {
      auto v = to_doubles(*t);
      all.insert(all.end(), v.begin(), v.end());
    }
    runs.push_back(all);
  }
  omp_set_num_threads(prev);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(CpuNorms, AcceptsLeadingDimsAndRejectsBadShapes) {
  Tensor x = random_tensor({2, 3, 8}, 1), g = random_tensor({8}, 2);
  Tensor y = Tensor::empty({2, 3, 8}), mean = Tensor::empty({6}), rstd = Tensor::empty({6});
  EXPECT_NO_THROW(cpu::layernorm_fwd(y, mean, rstd, x, g, nullptr, 1e-5f, {}));
  Tensor g_bad = Tensor::zeros({7});
  try {
    cpu::layernorm_fwd(y, mean, rstd, x, g_bad, nullptr, 1e-5f, {});
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layernorm_fwd: gamma must have 8 elements"), std::string::npos) << e.what();
  }
  Tensor rstd_bad = Tensor::empty({5});
  EXPECT_THROW(cpu::rmsnorm_fwd(y, rstd_bad, x, g, 1e-5f, {}), Error);
  Tensor y_bad = Tensor::empty({6, 8});
  EXPECT_THROW(cpu::rmsnorm_fwd(y_bad, rstd, x, g, 1e-5f, {}), Error);
}

}  // namespace
}  // namespace mcpp
