// CUDA qkv_split / qkv_merge (semantics of kernels/cpu/qkv.cpp and ops.inc): Megatron's fused QKV rows
//   qkv[s, b, ng * (r + 2) * d], per query group [q_0 .. q_{r-1}, k, v]  <->  q[s, b, nq, d], k/v[s, b, ng, d].
// float32 / bf16 / f16 on either side (converted on store). Outputs overwritten; asynchronous on
// stream_of(stream). qkv_split_rope / qkv_merge_rope: the same with q and k rotated (rope_kernels.cu, one kernel
// when the 16-byte layout applies: d and rot/2 multiples of 8, aligned; else the composition), one dtype.
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/kernels/packed_qkv.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
QkvShape check_qkv(const char* op, const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v) {
  require_float(op, "qkv", qkv);
  require_float(op, "q", q);
  require_float(op, "k", k);
  require_float(op, "v", v);
  MCPP_CHECK(q.ndim() == 4 && k.ndim() == 4, "{}: q and k must be [s, b, heads, d]; got {} and {}", op, q.str(),
             k.str());
  require_same_shape(op, "v", v, "k", k);
  const QkvShape a{q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3)};
  MCPP_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == a.d && a.ng > 0 && a.nq % a.ng == 0,
             "{}: k {} does not match q {} (GQA needs nq a multiple of ng)", op, k.str(), q.str());
  require_numel(op, "qkv", qkv, a.sb * (a.nq + 2 * a.ng) * a.d, "s * b * (nq + 2 ng) * d");
  return a;
}
}  // namespace

void qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, Stream stream) {
  const QkvShape a = check_qkv("qkv_split", qkv, q, k, v);
  launch_qkv_split(fout_of("qkv_split", "q", q), fout_of("qkv_split", "k", k), fout_of("qkv_split", "v", v),
                   fin_of("qkv_split", "qkv", qkv), a, stream_of(stream));
}

void qkv_merge(Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, Stream stream) {
  const QkvShape a = check_qkv("qkv_merge", qkv, q, k, v);
  launch_qkv_merge(fout_of("qkv_merge", "qkv", qkv), fin_of("qkv_merge", "q", q), fin_of("qkv_merge", "k", k),
                   fin_of("qkv_merge", "v", v), a, stream_of(stream));
}

namespace {
// The checks of both fused ops; returns the rotary half (cos.size(1)).
int64_t check_rope_tables(const char* op, const Tensor& q, const Tensor& cos, const Tensor& sin) {
  require_float(op, "cos", cos, /*bf16_ok=*/false);
  require_float(op, "sin", sin, /*bf16_ok=*/false);
  MCPP_CHECK(cos.ndim() == 2 && cos.size(0) == q.size(0), "{}: cos must be [s={}, rot/2]; got {}", op, q.size(0),
             cos.str());
  require_same_shape(op, "sin", sin, "cos", cos);
  MCPP_CHECK(2 * cos.size(1) <= q.size(3), "{}: rotary dim 2*cos.size(1) = {} exceeds head dim d = {}", op,
             2 * cos.size(1), q.size(3));
  return cos.size(1);
}
}  // namespace

void qkv_split_rope(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                    Stream stream) {
  const char* op = "qkv_split_rope";
  const QkvShape a = check_qkv(op, qkv, q, k, v);
  const int64_t half = check_rope_tables(op, q, cos, sin);
  MCPP_CHECK(q.dtype() == qkv.dtype() && k.dtype() == qkv.dtype() && v.dtype() == qkv.dtype(),
             "{}: q, k, v must have qkv's dtype; got {}, {}, {} and {}", op, q.str(), k.str(), v.str(), qkv.str());
  if (launch_qkv_rope(true, FOut{nullptr, 0}, fout_of(op, "q", q), fout_of(op, "k", k), fout_of(op, "v", v),
                      fin_of(op, "qkv", qkv), FIn{nullptr, 0}, FIn{nullptr, 0}, FIn{nullptr, 0}, cos.data<float>(),
                      sin.data<float>(), a, q.size(1), half, stream_of(stream)))
    return;
  qkv_split(q, k, v, qkv, stream);  // the composition the kernel equals
  rope_fwd(q, q, cos, sin, stream);
  rope_fwd(k, k, cos, sin, stream);
}

void qkv_merge_rope(Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                    const Tensor& sin, Stream stream) {
  const char* op = "qkv_merge_rope";
  const QkvShape a = check_qkv(op, qkv, q, k, v);
  const int64_t half = check_rope_tables(op, q, cos, sin);
  MCPP_CHECK(q.dtype() == qkv.dtype() && k.dtype() == qkv.dtype() && v.dtype() == qkv.dtype(),
             "{}: q, k, v must have qkv's dtype; got {}, {}, {} and {}", op, q.str(), k.str(), v.str(), qkv.str());
  if (launch_qkv_rope(false, fout_of(op, "qkv", qkv), FOut{nullptr, 0}, FOut{nullptr, 0}, FOut{nullptr, 0},
                      FIn{nullptr, 0}, fin_of(op, "q", q), fin_of(op, "k", k), fin_of(op, "v", v), cos.data<float>(),
                      sin.data<float>(), a, q.size(1), half, stream_of(stream)))
    return;
  // the composition; its temporaries are freed stream-ordered on the compute stream: on another stream, wait first
  const cudaStream_t s = stream_of(stream);
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  Tensor dq = Tensor::empty(q.shape(), q.dtype(), Device::CUDA), dk = Tensor::empty(k.shape(), k.dtype(), Device::CUDA);
  rope_bwd(dq, q, cos, sin, stream);
  rope_bwd(dk, k, cos, sin, stream);
  qkv_merge(qkv, dq, dk, v, stream);
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(s));
}

// min(a, c) strided 2-D copies (at most the CP size: one per all-to-all peer): per output chunk j, a rows of m
// elements from in (pitch c * m) to out (pitch m); or per input row i, c rows from in (pitch m) to out (pitch
// a * m). (Looping over the larger dimension issued one copy per token row: 16K calls a layer at 124M, CP2.)
void chunk_transpose(Tensor& out, const Tensor& in, int64_t a, int64_t c, Stream stream) {
  const size_t m = ops::detail::chunk_transpose_block_bytes(out, in, a, c);
  MCPP_CHECK(out.device() == Device::CUDA && in.device() == Device::CUDA,
             "chunk_transpose: CUDA tensors expected; got {} and {}", out.str(), in.str());
  if (m == 0) return;
  const char* src = static_cast<const char*>(in.raw());
  char* dst = static_cast<char*>(out.raw());
  if (c <= a) {
    for (int64_t j = 0; j < c; ++j)
      MCPP_CUDA_CHECK(cudaMemcpy2DAsync(dst + j * a * m, m, src + j * m, c * m, m, static_cast<size_t>(a),
                                        cudaMemcpyDeviceToDevice, stream_of(stream)));
  } else {
    for (int64_t i = 0; i < a; ++i)
      MCPP_CUDA_CHECK(cudaMemcpy2DAsync(dst + i * m, a * m, src + i * c * m, m, m, static_cast<size_t>(c),
                                        cudaMemcpyDeviceToDevice, stream_of(stream)));
  }
}

}  // namespace mcpp::ops::cuda
