// CUDA qkv_split / qkv_merge (semantics of kernels/cpu/qkv.cpp and ops.inc): Megatron's fused QKV rows
//   qkv[s, b, ng * (r + 2) * d], per query group [q_0 .. q_{r-1}, k, v]  <->  q[s, b, nq, d], k/v[s, b, ng, d].
// float32 / bf16 / f16 on either side (converted on store). Outputs overwritten; asynchronous on
// stream_of(stream).
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
