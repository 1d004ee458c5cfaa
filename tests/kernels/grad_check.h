// Float64 helpers for kernel tests: deterministic random fills, tensor <-> double vector copies,
// max relative error, and central finite differences of a scalar function of a double vector.
//
// Contract: header-only, no state. A backward kernel is checked against d/dx of the scalar loss
// L(x) = sum(dy * f(x)) with f computed in double by the test; numeric_grad() returns dL/dx by central
// differences (step h, error O(h^2) — with h = 1e-5 on O(1) inputs the result is good to ~1e-9, far
// below the fp32 kernels' ~1e-6 rounding, so the fp32 kernel's rounding dominates every comparison).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp::testing {

// Uniform values in [lo, hi) from a fixed seed (std::mt19937_64, same sequence on every platform).
inline std::vector<double> random_vec(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = lo + (hi - lo) * (static_cast<double>(gen() >> 11) * 0x1.0p-53);
  return v;
}

// Fill a float32 tensor with uniform values in [lo, hi); returns the values actually stored (rounded to
// fp32) as doubles, so float64 references see exactly what the kernel sees.
inline std::vector<double> fill_random(Tensor& t, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::vector<double> v = random_vec(t.numel(), seed, lo, hi);
  float* p = t.data<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    p[i] = static_cast<float>(v[i]);
    v[i] = p[i];
  }
  return v;
}

// A new float32 tensor of `shape` filled as fill_random; `values` receives the stored doubles.
inline Tensor random_tensor(const Shape& shape, uint64_t seed, std::vector<double>* values = nullptr,
                            double lo = -1.0, double hi = 1.0) {
  Tensor t = Tensor::empty(shape);
  std::vector<double> v = fill_random(t, seed, lo, hi);
  if (values) *values = std::move(v);
  return t;
}

inline std::vector<double> to_doubles(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<double>(p, p + t.numel());
}

inline Tensor from_doubles(const std::vector<double>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<float>(v[i]);
  return t;
}

// max_i |got_i - want_i| / (|want_i| + floor). The floor keeps near-zero references from turning
// rounding noise into huge ratios; pick it at the scale of the values compared (1e-3 for O(1) data).
inline double max_rel_error(const std::vector<double>& got, const std::vector<double>& want,
                            double floor = 1e-3) {
  double worst = 0.0;
  size_t n = std::min(got.size(), want.size());
  if (got.size() != want.size()) return INFINITY;
  for (size_t i = 0; i < n; ++i) {
    double e = std::abs(got[i] - want[i]) / (std::abs(want[i]) + floor);
    if (!(e <= worst)) worst = e;  // NaN propagates as worst
  }
  return worst;
}

inline double max_rel_error(const Tensor& got, const std::vector<double>& want, double floor = 1e-3) {
  return max_rel_error(to_doubles(got), want, floor);
}

inline double max_abs_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return INFINITY;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::abs(got[i] - want[i]);
    if (!(e <= worst)) worst = e;
  }
  return worst;
}

// Central finite differences: grad_i = (f(x + h e_i) - f(x - h e_i)) / 2h, all in double.
inline std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f,
                                        std::vector<double> x, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    double fp = f(x);
    x[i] = x0 - h;
    double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

// sum_i a_i * b_i in double: the scalar loss sum(dy * f(x)) used by backward checks.
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace mcpp::testing
