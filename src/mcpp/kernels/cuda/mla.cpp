// CUDA multi-latent attention's query / key / value assembly and its backward (ops.inc mla_qkv_fwd / mla_qkv_bwd;
// mla_kernels.cu), float32 or bf16 activations, float32 math; copy_columns as one strided cudaMemcpy2DAsync.
// Asynchronous on stream_of(stream).
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
MlaShape mla_shape(const MlaQkvShape& m) {  // the kernels index within a token in 32 bits
  MCPP_CHECK(m.n * (m.dc + m.dn + m.dr) < (int64_t{1} << 30), "mla_qkv: {} heads of {} channels exceed the kernels' "
             "per-token indexing", m.n, m.dc);
  return {m.s * m.b, m.n, m.dn, m.dr, m.dv, m.dc, m.c};
}
void require_cuda(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) MCPP_CHECK(t->device() == Device::CUDA, "{}: CUDA tensors expected; got {}", op, t->str());
}
}  // namespace

void mla_qkv_fwd(Tensor& query, Tensor& key, Tensor& value, const Tensor& q, const Tensor& kv, const Tensor& kv_latent,
                 const Tensor& cos, const Tensor& sin, Stream stream) {
  const char* op = "mla_qkv_fwd";
  const MlaQkvShape m = check_mla_qkv(op, query, key, value, q, kv, kv_latent, false, cos, sin, false);
  require_cuda(op, {&query, &key, &value, &q, &kv, &kv_latent, &cos, &sin});
  launch_mla_qkv_fwd(fout_of(op, "query", query), fout_of(op, "key", key), fout_of(op, "value", value),
                     fin_of(op, "q", q), fin_of(op, "kv", kv), fin_of(op, "kv_latent", kv_latent), cos.data<float>(),
                     sin.data<float>(), m.b, mla_shape(m), stream_of(stream));
}

void mla_qkv_bwd(Tensor& dq, Tensor& dkv, Tensor& dk_pe, const Tensor& dquery, const Tensor& dkey, const Tensor& dvalue,
                 const Tensor& cos, const Tensor& sin, Stream stream) {
  const char* op = "mla_qkv_bwd";
  const MlaQkvShape m = check_mla_qkv(op, dquery, dkey, dvalue, dq, dkv, dk_pe, true, cos, sin, false);
  require_cuda(op, {&dq, &dkv, &dk_pe, &dquery, &dkey, &dvalue, &cos, &sin});
  launch_mla_qkv_bwd(fout_of(op, "dq", dq), fout_of(op, "dkv", dkv), fout_of(op, "dk_pe", dk_pe),
                     fin_of(op, "dquery", dquery), fin_of(op, "dkey", dkey), fin_of(op, "dvalue", dvalue),
                     cos.data<float>(), sin.data<float>(), m.b, mla_shape(m), stream_of(stream));
}

void copy_columns(Tensor& y, const Tensor& x, int64_t y_offset, int64_t x_offset, int64_t width, Stream stream) {
  require_cuda("copy_columns", {&y, &x});
  const int64_t rows = check_copy_columns(y, x, y_offset, x_offset, width);
  if (rows == 0 || width == 0) return;
  const auto e = static_cast<int64_t>(dtype_size(x.dtype()));
  const int64_t cx = x.size(-1), cy = y.size(-1);
  MCPP_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(y.raw()) + y_offset * e, static_cast<size_t>(cy * e),
                                    static_cast<const char*>(x.raw()) + x_offset * e, static_cast<size_t>(cx * e),
                                    static_cast<size_t>(width * e), static_cast<size_t>(rows),
                                    cudaMemcpyDeviceToDevice, stream_of(stream)));
}

}  // namespace mcpp::ops::cuda
