// CPU dropout and random numbers with a counter-based key (core/rng.h). Dropout: element i (flat index in the
// tensor) is kept iff philox_uniform_at(key, i) >= p, and kept values are scaled by 1/(1-p).
//
//   dropout_fwd: y = keep(i) ? x / (1-p) : 0     (p == 0 copies; p == 1 gives zeros)
//   dropout_bwd: dx = keep(i) ? dy / (1-p) : 0   (the mask is regenerated from the same key, not stored)
// x/y (dy/dx): float32, same numel, any shape; outputs overwritten, may alias the input. The key's
// offset counts 4-draw groups, so element i uses counter key.offset + i/4, lane i%4 — the same numbers
// a CUDA kernel reading the same key draws. Parallel over 4-element groups; no order dependence.
//   random_normal / random_scale: ops.inc's definitions (float32 here).
#include <cmath>
#include <cstring>
#include <numbers>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

namespace {
// fn(i, u_i) for every element i < n, u_i = philox_uniform_at(key, i): one Philox call per 4 elements, OpenMP over
// the groups (no order dependence).
template <class Fn> void for_each_uniform(const PhiloxKey& key, int64_t n, Fn&& fn) {
  const int64_t groups = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t g = 0; g < groups; ++g) {
    const auto r = philox4x32_10(key.seed, key.offset + static_cast<uint64_t>(g), 0);
    for (int64_t lane = 0; lane < 4 && 4 * g + lane < n; ++lane)
      fn(4 * g + lane, philox_uniform(r[static_cast<size_t>(lane)]));
  }
}

void dropout_apply(const char* op, Tensor& out, const char* out_name, const Tensor& in, const char* in_name,
                   float p, const PhiloxKey& key) {
  require_cpu_f32(op, out_name, out);
  require_cpu_f32(op, in_name, in);
  detail::require_numel(op, in_name, in, out.numel(), "numel of the output");
  MCPP_CHECK(p >= 0.0f && p <= 1.0f, "{}: dropout probability p must be in [0, 1]; got {}", op, p);
  MCPP_CHECK(!key.device_base, "{}: a CUDA-graph key (device offset base) on the CPU backend", op);
  const int64_t n = out.numel();
  const float* px = in.data<float>();
  float* py = out.data<float>();
  if (p == 0.0f) {
    if (py != px) std::memmove(py, px, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  for_each_uniform(key, n, [&](int64_t i, float u) { py[i] = u >= p ? px[i] * scale : 0.0f; });
}
}  // namespace

void dropout_fwd(Tensor& y, const Tensor& x, float p, const PhiloxKey& key, Stream) {
  dropout_apply("dropout_fwd", y, "y", x, "x", p, key);
}

void dropout_bwd(Tensor& dx, const Tensor& dy, float p, const PhiloxKey& key, Stream) {
  dropout_apply("dropout_bwd", dx, "dx", dy, "dy", p, key);
}

void random_normal(Tensor& out, const PhiloxKey& key, Stream) {
  require_cpu_f32("random_normal", "out", out);
  MCPP_CHECK(!key.device_base, "random_normal: a CUDA-graph key (device offset base) on the CPU backend");
  const int64_t n = out.numel();
  float* po = out.data<float>();
#pragma omp parallel for schedule(static) if (n > (1 << 14))
  for (int64_t i = 0; i < n; ++i) {  // words 2i, 2i + 1: lanes 0-1 or 2-3 of counter offset + i / 2
    const auto r = philox4x32_10(key.seed, key.offset + static_cast<uint64_t>(i / 2), 0);
    const size_t lane = static_cast<size_t>(2 * (i % 2));
    const double u1 = (static_cast<double>(r[lane] >> 8) + 0.5) * (1.0 / 16777216.0);
    const double u2 = static_cast<double>(r[lane + 1] >> 8) * (1.0 / 16777216.0);
    po[i] = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }
}

void random_scale(Tensor& y, const Tensor& x, float lo, float hi, const PhiloxKey& key, Stream) {
  require_cpu_f32("random_scale", "y", y);
  require_cpu_f32("random_scale", "x", x);
  detail::require_numel("random_scale", "x", x, y.numel(), "numel of y");
  MCPP_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "random_scale: need finite lo <= hi; got [{}, {}]",
             lo, hi);
  MCPP_CHECK(!key.device_base, "random_scale: a CUDA-graph key (device offset base) on the CPU backend");
  const int64_t n = y.numel();
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const float width = hi - lo;
  for_each_uniform(key, n, [&](int64_t i, float u) { py[i] = px[i] * std::fma(width, u, lo); });
}

}  // namespace mcpp::ops::cpu
