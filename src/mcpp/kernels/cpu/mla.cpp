// CPU multi-latent attention's query / key / value assembly and its backward (ops.inc: mla_qkv_fwd / mla_qkv_bwd),
// float32; and copy_columns (any dtype, bytes). Parallel over the tokens of [s, b].
#include <algorithm>
#include <cstring>
#include <vector>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {

namespace {
// Megatron's MLA RoPE on dr = 2 * half channels: the evens then the odds, then rotate_half (ops.inc).
void mla_rope(float* out, const float* x, const float* c, const float* sn, int64_t half) {
  for (int64_t j = 0; j < half; ++j) {
    const float x0 = x[2 * j], x1 = x[2 * j + 1];
    out[j] = x0 * c[j] - x1 * sn[j];
    out[j + half] = x1 * c[j] + x0 * sn[j];
  }
}
// Its transpose: dx[2j] = dy[j] cos + dy[j + half] sin, dx[2j+1] = dy[j + half] cos - dy[j] sin.
void mla_rope_bwd(float* dx, const float* dy, const float* c, const float* sn, int64_t half) {
  for (int64_t j = 0; j < half; ++j) {
    const float a = dy[j], b = dy[j + half];
    dx[2 * j] = a * c[j] + b * sn[j];
    dx[2 * j + 1] = b * c[j] - a * sn[j];
  }
}
}  // namespace

void mla_qkv_fwd(Tensor& query, Tensor& key, Tensor& value, const Tensor& q, const Tensor& kv, const Tensor& kv_latent,
                 const Tensor& cos, const Tensor& sin, Stream) {
  const MlaQkvShape m = check_mla_qkv("mla_qkv_fwd", query, key, value, q, kv, kv_latent, /*latent_is_pe=*/false, cos,
                                      sin, /*fp32_only=*/true);
  const int64_t half = m.dr / 2, dq = m.dn + m.dr, dkv = m.dn + m.dv;
  const float* pq = q.data<float>();
  const float* pkv = kv.data<float>();
  const float* pl = kv_latent.data<float>();
  float* pqu = query.data<float>();
  float* pk = key.data<float>();
  float* pv = value.data<float>();
#pragma omp parallel if (query.numel() > (1 << 15))
  {
  std::vector<float> k_pe(static_cast<size_t>(m.dr));  // this thread's rotated shared key (one allocation a thread)
#pragma omp for schedule(static)
  for (int64_t t = 0; t < m.s * m.b; ++t) {
    const float* c = cos.data<float>() + (t / m.b) * half;
    const float* sn = sin.data<float>() + (t / m.b) * half;
    mla_rope(k_pe.data(), pl + t * m.c + (m.c - m.dr), c, sn, half);
    for (int64_t i = 0; i < m.n; ++i) {
      const int64_t h = t * m.n + i;
      const float* qr = pq + h * dq;
      const float* kvr = pkv + h * dkv;
      float* qo = pqu + h * m.dc;
      float* ko = pk + h * m.dc;
      float* vo = pv + h * m.dc;
      for (int64_t j = 0; j < m.dn; ++j) qo[j] = qr[j];
      mla_rope(qo + m.dn, qr + m.dn, c, sn, half);
      for (int64_t j = dq; j < m.dc; ++j) qo[j] = 0.0f;
      for (int64_t j = 0; j < m.dn; ++j) ko[j] = kvr[j];
      for (int64_t j = 0; j < m.dr; ++j) ko[m.dn + j] = k_pe[static_cast<size_t>(j)];
      for (int64_t j = dq; j < m.dc; ++j) ko[j] = 0.0f;
      for (int64_t j = 0; j < m.dv; ++j) vo[j] = kvr[m.dn + j];
      for (int64_t j = m.dv; j < m.dc; ++j) vo[j] = 0.0f;
    }
  }
  }
}

void mla_qkv_bwd(Tensor& dq, Tensor& dkv, Tensor& dk_pe, const Tensor& dquery, const Tensor& dkey, const Tensor& dvalue,
                 const Tensor& cos, const Tensor& sin, Stream) {
  const MlaQkvShape m = check_mla_qkv("mla_qkv_bwd", dquery, dkey, dvalue, dq, dkv, dk_pe, /*latent_is_pe=*/true, cos,
                                      sin, /*fp32_only=*/true);
  const int64_t half = m.dr / 2, dqw = m.dn + m.dr, dkvw = m.dn + m.dv;
  const float* pdqu = dquery.data<float>();
  const float* pdk = dkey.data<float>();
  const float* pdv = dvalue.data<float>();
  float* pdq = dq.data<float>();
  float* pdkv = dkv.data<float>();
  float* ppe = dk_pe.data<float>();
#pragma omp parallel if (dquery.numel() > (1 << 15))
  {
  std::vector<float> sum(static_cast<size_t>(m.dr));  // the shared key part's gradient, over the heads (a thread's)
#pragma omp for schedule(static)
  for (int64_t t = 0; t < m.s * m.b; ++t) {
    const float* c = cos.data<float>() + (t / m.b) * half;
    const float* sn = sin.data<float>() + (t / m.b) * half;
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int64_t i = 0; i < m.n; ++i) {
      const int64_t h = t * m.n + i;
      const float* gq = pdqu + h * m.dc;
      const float* gk = pdk + h * m.dc;
      const float* gv = pdv + h * m.dc;
      float* oq = pdq + h * dqw;
      float* okv = pdkv + h * dkvw;
      for (int64_t j = 0; j < m.dn; ++j) oq[j] = gq[j];
      mla_rope_bwd(oq + m.dn, gq + m.dn, c, sn, half);
      for (int64_t j = 0; j < m.dn; ++j) okv[j] = gk[j];
      for (int64_t j = 0; j < m.dv; ++j) okv[m.dn + j] = gv[j];
      for (int64_t j = 0; j < m.dr; ++j) sum[static_cast<size_t>(j)] += gk[m.dn + j];
    }
    mla_rope_bwd(ppe + t * m.dr, sum.data(), c, sn, half);
  }
  }
}

void copy_columns(Tensor& y, const Tensor& x, int64_t y_offset, int64_t x_offset, int64_t width, Stream) {
  MCPP_CHECK(y.is_cpu() && x.is_cpu(), "copy_columns: x {} and y {} must be CPU tensors", x.str(), y.str());
  const int64_t rows = check_copy_columns(y, x, y_offset, x_offset, width);
  const size_t e = dtype_size(x.dtype());
  const int64_t cx = x.size(-1), cy = y.size(-1);
  const auto* px = static_cast<const unsigned char*>(x.raw());
  auto* py = static_cast<unsigned char*>(y.raw());
#pragma omp parallel for schedule(static) if (rows * width > (1 << 16))
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(py + (r * cy + y_offset) * static_cast<int64_t>(e), px + (r * cx + x_offset) * static_cast<int64_t>(e),
                static_cast<size_t>(width) * e);
}

}  // namespace mcpp::ops::cpu
