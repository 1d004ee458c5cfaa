// CUDA mixture-of-experts row movement (ops.inc: moe_permute / moe_unpermute / moe_unpermute_bwd), kernels in
// moe_kernels.cu. Activations float32 or bf16 (one dtype per call); idx int32 [n, k], w / dw float32 [n, k].
// The shapes are checked here; idx's entries are not read on the host (the dispatcher builds them: distinct
// rows < m). Async on stream_of(stream).
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
struct Routes {
  int64_t n, k, h;
};

Routes check_routes(const char* op, const Tensor& tokens, const char* tokens_name, const Tensor& buffer,
                    const char* buffer_name, const Tensor& idx) {
  require_i32(op, "idx", idx);
  const Kind kt = require_float(op, tokens_name, tokens), kb = require_float(op, buffer_name, buffer);
  MCPP_CHECK(kt == kb, "{}: {} and {} must have one dtype; got {} and {}", op, tokens_name, buffer_name,
             tokens.str(), buffer.str());
  MCPP_CHECK(idx.ndim() == 2 && tokens.ndim() == 2 && buffer.ndim() == 2 && tokens.size(1) == buffer.size(1) &&
                 tokens.size(0) == idx.size(0) && buffer.size(0) >= idx.numel(),
             "{}: idx must be [n, k], {} [n, h] and {} [m >= n*k, h]; got {}, {} and {}", op, tokens_name,
             buffer_name, idx.str(), tokens.str(), buffer.str());
  return {idx.size(0), idx.size(1), tokens.size(1)};
}

void check_weights(const char* op, const char* arg, const Tensor& w, const Routes& r) {
  require_float(op, arg, w, /*bf16_ok=*/false);
  MCPP_CHECK(w.ndim() == 2 && w.size(0) == r.n && w.size(1) == r.k, "{}: {} must be [n={}, k={}]; got {}", op, arg,
             r.n, r.k, w.str());
}
}  // namespace

void moe_permute(Tensor& out, const Tensor& x, const Tensor& idx, Stream stream) {
  const Routes r = check_routes("moe_permute", x, "x", out, "out", idx);
  launch_moe_permute(fout_of("moe_permute", "out", out), fin_of("moe_permute", "x", x), idx.data<int32_t>(), r.n,
                     r.k, r.h, stream_of(stream));
}

void moe_unpermute(Tensor& y, const Tensor& in, const Tensor& idx, const Tensor* w, Stream stream) {
  const Routes r = check_routes("moe_unpermute", y, "y", in, "in", idx);
  if (w) check_weights("moe_unpermute", "w", *w, r);
  launch_moe_unpermute(fout_of("moe_unpermute", "y", y), fin_of("moe_unpermute", "in", in), idx.data<int32_t>(),
                       w ? w->data<float>() : nullptr, r.n, r.k, r.h, stream_of(stream));
}

void moe_unpermute_bwd(Tensor& din, Tensor& dw, const Tensor& dy, const Tensor& in, const Tensor& idx, const Tensor& w,
                       Stream stream) {
  const Routes r = check_routes("moe_unpermute_bwd", dy, "dy", in, "in", idx);
  require_same_shape("moe_unpermute_bwd", "din", din, "in", in);
  MCPP_CHECK(din.dtype() == in.dtype(), "moe_unpermute_bwd: din must have in's dtype; got {} and {}", din.str(),
             in.str());
  check_weights("moe_unpermute_bwd", "w", w, r);
  check_weights("moe_unpermute_bwd", "dw", dw, r);
  launch_moe_unpermute_bwd(fout_of("moe_unpermute_bwd", "din", din), dw.data<float>(),
                           fin_of("moe_unpermute_bwd", "dy", dy), fin_of("moe_unpermute_bwd", "in", in),
                           idx.data<int32_t>(), w.data<float>(), r.n, r.k, r.h, stream_of(stream));
}

}  // namespace mcpp::ops::cuda
