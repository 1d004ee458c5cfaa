// CPU mixture-of-experts row movement (ops.inc: moe_permute / moe_unpermute / moe_unpermute_bwd), the
// reference for the CUDA kernels. float32 activations; idx int32 [n, k] of distinct rows < m; w, dw float32
// [n, k]. Sums over a token's k routes run in route order, in float32 (as the CUDA kernels accumulate).
#include <cstring>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
namespace {

struct Routes {
  int64_t n, k, m, h;
};

// idx [n, k] int32 against x-like rows [n, h] and buffer rows [m, h]; every entry in [0, m).
Routes check_routes(const char* op, const Tensor& tokens, const char* tokens_name, const Tensor& buffer,
                    const char* buffer_name, const Tensor& idx) {
  detail::require_cpu_f32(op, tokens_name, tokens);
  detail::require_cpu_f32(op, buffer_name, buffer);
  MCPP_CHECK(idx.defined() && idx.is_cpu() && idx.dtype() == DType::I32 && idx.ndim() == 2,
             "{}: idx must be a CPU int32 [n, k] tensor; got {}", op, idx.defined() ? idx.str() : "undefined");
  MCPP_CHECK(tokens.ndim() == 2 && buffer.ndim() == 2 && tokens.size(1) == buffer.size(1) &&
                 tokens.size(0) == idx.size(0),
             "{}: {} must be [n={}, h] and {} [m, h] with the same h; got {} and {}", op, tokens_name, idx.size(0),
             buffer_name, tokens.str(), buffer.str());
  const Routes r{idx.size(0), idx.size(1), buffer.size(0), tokens.size(1)};
  const int32_t* p = idx.data<int32_t>();
  for (int64_t j = 0; j < r.n * r.k; ++j)
    MCPP_CHECK(p[j] >= 0 && p[j] < r.m, "{}: idx entry {} = {} is not a row of {} (m = {})", op, j, p[j],
               buffer_name, r.m);
  return r;
}

void check_weights(const char* op, const char* arg, const Tensor& w, const Routes& r) {
  detail::require_cpu_f32(op, arg, w);
  MCPP_CHECK(w.ndim() == 2 && w.size(0) == r.n && w.size(1) == r.k, "{}: {} must be [n={}, k={}]; got {}", op, arg,
             r.n, r.k, w.str());
}

}  // namespace

void moe_permute(Tensor& out, const Tensor& x, const Tensor& idx, Stream) {
  const Routes r = check_routes("moe_permute", x, "x", out, "out", idx);
  const int32_t* ip = idx.data<int32_t>();
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  for (int64_t t = 0; t < r.n; ++t)
    for (int64_t i = 0; i < r.k; ++i)
      std::memcpy(op + ip[t * r.k + i] * r.h, xp + t * r.h, static_cast<size_t>(r.h) * sizeof(float));
}

void moe_unpermute(Tensor& y, const Tensor& in, const Tensor& idx, const Tensor* w, Stream) {
  const Routes r = check_routes("moe_unpermute", y, "y", in, "in", idx);
  if (w) check_weights("moe_unpermute", "w", *w, r);
  const int32_t* ip = idx.data<int32_t>();
  const float* src = in.data<float>();
  const float* wp = w ? w->data<float>() : nullptr;
  float* yp = y.data<float>();
  for (int64_t t = 0; t < r.n; ++t) {
    float* row = yp + t * r.h;
    for (int64_t c = 0; c < r.h; ++c) row[c] = 0.0f;
    for (int64_t i = 0; i < r.k; ++i) {
      const float wi = wp ? wp[t * r.k + i] : 1.0f;
      const float* s = src + ip[t * r.k + i] * r.h;
      for (int64_t c = 0; c < r.h; ++c) row[c] += wi * s[c];
    }
  }
}

void moe_unpermute_bwd(Tensor& din, Tensor& dw, const Tensor& dy, const Tensor& in, const Tensor& idx,
                       const Tensor& w, Stream) {
  const Routes r = check_routes("moe_unpermute_bwd", dy, "dy", in, "in", idx);
  detail::require_same_shape("moe_unpermute_bwd", "din", din, "in", in);
  detail::require_cpu_f32("moe_unpermute_bwd", "din", din);
  check_weights("moe_unpermute_bwd", "w", w, r);
  check_weights("moe_unpermute_bwd", "dw", dw, r);
  const int32_t* ip = idx.data<int32_t>();
  const float *dyp = dy.data<float>(), *src = in.data<float>(), *wp = w.data<float>();
  float *dinp = din.data<float>(), *dwp = dw.data<float>();
  for (int64_t t = 0; t < r.n; ++t) {
    const float* g = dyp + t * r.h;
    for (int64_t i = 0; i < r.k; ++i) {
      const int64_t j = ip[t * r.k + i];
      const float wi = wp[t * r.k + i];
      const float* s = src + j * r.h;
      float* d = dinp + j * r.h;
      float dot = 0.0f;
      for (int64_t c = 0; c < r.h; ++c) {
        dot += g[c] * s[c];
        d[c] = wi * g[c];
      }
      dwp[t * r.k + i] = dot;
    }
  }
}

}  // namespace mcpp::ops::cpu
