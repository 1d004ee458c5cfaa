// CUDA mixture-of-experts row movement (ops.inc: moe_permute / moe_unpermute / moe_unpermute_bwd), kernels in
// moe_kernels.cu. Activations float32 or bf16 (one dtype per call); idx int32 [n, k], w / dw float32 [n, k].
// The shapes are checked here; idx's entries are not read on the host (the router builds them: distinct rows < m
// or -1 for a dropped route). Async on stream_of(stream).
#include <algorithm>

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
                 tokens.size(0) == idx.size(0),
             "{}: idx must be [n, k], {} [n, h] and {} [m, h]; got {}, {} and {}", op, tokens_name,
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

namespace {
void check_shape(const char* op, const char* arg, const Tensor& t, DType dt, const Shape& shape) {
  MCPP_CHECK(t.defined() && t.device() == Device::CUDA && t.dtype() == dt && t.shape() == shape,
             "{}: {} must be a CUDA {} {} tensor; got {}", op, arg, dtype_name(dt), shape_str(shape),
             t.defined() ? t.str() : "undefined");
}
}  // namespace

namespace {
MoeTopkArgs topk_args(const MoeTopkOptions& o) {
  static_assert(kMaxGroups == kMaxMoeRouterGroups);
  MCPP_CHECK(!o.expert_bias.defined() || o.expert_bias.device() == Device::CUDA,
             "moe_topk_softmax: the expert bias must be on the GPU; got {}", o.expert_bias.str());
  MCPP_CHECK(!o.logit_bias.defined() || o.logit_bias.device() == Device::CUDA,
             "moe_topk_softmax: the logit bias must be on the GPU; got {}", o.logit_bias.str());
  return {.pre_softmax = o.pre_softmax, .sigmoid = o.sigmoid, .num_groups = o.num_groups, .group_topk = o.group_topk,
          .expert_bias = o.expert_bias.defined() ? o.expert_bias.data<float>() : nullptr,
          .logit_bias = o.logit_bias.defined() ? o.logit_bias.data<float>() : nullptr};
}
}  // namespace

void moe_topk_softmax(Tensor& topk, Tensor& probs, Tensor& scores, Tensor& lse, const Tensor& logits,
                      const MoeTopkOptions& opt, Stream stream) {
  const char* op = "moe_topk_softmax";
  const FIn lg = fin_of(op, "logits", logits);
  MCPP_CHECK(logits.ndim() == 2, "{}: logits must be [n, E]; got {}", op, logits.str());
  const int64_t n = logits.size(0), e = logits.size(1), k = topk.ndim() == 2 ? topk.size(1) : 0;
  MCPP_CHECK(k >= 1 && k <= e && k <= 64, "{}: topk must be [n, k] with 1 <= k <= min(E = {}, 64); got {}", op, e,
             topk.str());
  check_shape(op, "topk", topk, DType::I32, {n, k});
  check_shape(op, "probs", probs, DType::F32, {n, k});
  check_shape(op, "scores", scores, DType::F32, {n, e});
  check_shape(op, "lse", lse, DType::F32, {n});
  check_moe_topk_options(op, opt, e, k);
  launch_moe_topk_softmax(topk.data<int32_t>(), probs.data<float>(), scores.data<float>(), lse.data<float>(), lg, n, e,
                          k, topk_args(opt), stream_of(stream));
}

void moe_topk_softmax_bwd(Tensor& dlogits, const Tensor& dprobs, const Tensor& probs, const Tensor& topk,
                          const Tensor& scores, const Tensor& lse, const Tensor& aux_grad, const MoeTopkOptions& opt,
                          Stream stream) {
  const char* op = "moe_topk_softmax_bwd";
  MCPP_CHECK(scores.ndim() == 2 && topk.ndim() == 2, "{}: scores must be [n, E], topk [n, k]; got {} and {}", op,
             scores.str(), topk.str());
  const int64_t n = scores.size(0), e = scores.size(1), k = topk.size(1);
  const FOut dl = fout_of(op, "dlogits", dlogits);
  MCPP_CHECK(dlogits.shape() == scores.shape(), "{}: dlogits must be [n, E] = {}; got {}", op,
             shape_str(scores.shape()), dlogits.str());
  check_shape(op, "scores", scores, DType::F32, {n, e});
  check_shape(op, "topk", topk, DType::I32, {n, k});
  check_shape(op, "dprobs", dprobs, DType::F32, {n, k});
  check_shape(op, "probs", probs, DType::F32, {n, k});
  check_shape(op, "lse", lse, DType::F32, {n});
  const int64_t rows = moe_aux_grad_rows(op, aux_grad, e);
  check_shape(op, "aux_grad", aux_grad, DType::F32, aux_grad.shape());  // on the device
  check_moe_topk_options(op, opt, e, k);
  MCPP_CHECK(!opt.sigmoid || opt.z_coef == 0.0f, "{}: the z-loss is not implemented with the sigmoid score function",
             op);
  launch_moe_topk_softmax_bwd(dl, dprobs.data<float>(), probs.data<float>(), topk.data<int32_t>(), scores.data<float>(),
                              lse.data<float>(), aux_grad.data<float>(), rows, n, e, k, topk_args(opt), opt.z_coef,
                              stream_of(stream));
}

void moe_route_positions(Tensor& idx, Tensor& counts, const Tensor& topk, Stream stream) {
  const char* op = "moe_route_positions";
  MCPP_CHECK(topk.ndim() == 2, "{}: topk must be [n, k]; got {}", op, topk.str());
  check_shape(op, "topk", topk, DType::I32, topk.shape());
  check_shape(op, "idx", idx, DType::I32, topk.shape());
  MCPP_CHECK(counts.ndim() == 1, "{}: counts must be [E]; got {}", op, counts.str());
  check_shape(op, "counts", counts, DType::I64, counts.shape());
  // scratch ordered on the compute stream, as the other ops' scratch
  Tensor scratch = Tensor::empty({std::max<int64_t>(moe_route_positions_scratch(topk.numel(), counts.numel()), 1)},
                                 DType::I32, Device::CUDA);
  launch_moe_route_positions(idx.data<int32_t>(), counts.data<int64_t>(), topk.data<int32_t>(), topk.numel(),
                             counts.numel(), scratch.data<int32_t>(), stream_of(stream));
}

void moe_sinkhorn(Tensor& log_d1, const Tensor& logits, float tol, Stream stream) {
  const char* op = "moe_sinkhorn";
  MCPP_CHECK(logits.ndim() == 2 && logits.size(1) >= 1 && logits.size(1) <= kMaxSinkhornExperts,
             "{}: logits must be [n, E] with 1 <= E <= {}; got {}", op, kMaxSinkhornExperts, logits.str());
  const int64_t n = logits.size(0), e = logits.size(1);
  check_shape(op, "logits", logits, DType::F32, {n, e});
  check_shape(op, "log_d1", log_d1, DType::F32, {e});
  Tensor d0 = Tensor::empty({std::max<int64_t>(n, 1)}, DType::F32, Device::CUDA);
  Tensor cost = Tensor::empty({std::max<int64_t>(n * e, 1)}, DType::F32, Device::CUDA);
  launch_moe_sinkhorn(log_d1.data<float>(), d0.data<float>(), cost.data<float>(), logits.data<float>(), n, e, tol,
                      kMaxSinkhornIterations, stream_of(stream));
}

void moe_route_counts(Tensor& counts, const Tensor& topk, const Tensor* idx, Stream stream) {
  const char* op = "moe_route_counts";
  MCPP_CHECK(topk.ndim() == 2 && counts.ndim() == 2 && counts.size(0) >= 1,
             "{}: topk must be [n, k], counts [G, E]; got {} and {}", op, topk.str(), counts.str());
  check_shape(op, "topk", topk, DType::I32, topk.shape());
  if (idx) check_shape(op, "idx", *idx, DType::I32, topk.shape());
  check_shape(op, "counts", counts, DType::F32, counts.shape());
  launch_moe_route_counts(counts.data<float>(), topk.data<int32_t>(), idx ? idx->data<int32_t>() : nullptr,
                          topk.numel(), topk.size(1), counts.size(0), counts.size(1), stream_of(stream));
}

void moe_capacity_positions(Tensor& idx, Tensor& kept, const Tensor& topk, const Tensor& probs, const Tensor& counts,
                            const MoeCapacityOptions& opt, Stream stream) {
  const char* op = "moe_capacity_positions";
  MCPP_CHECK(topk.ndim() == 2 && counts.ndim() == 1, "{}: topk must be [n, k], counts [E]; got {} and {}", op,
             topk.str(), counts.str());
  check_shape(op, "topk", topk, DType::I32, topk.shape());
  check_shape(op, "idx", idx, DType::I32, topk.shape());
  check_shape(op, "probs", probs, DType::F32, topk.shape());
  check_shape(op, "counts", counts, DType::I64, counts.shape());
  check_shape(op, "kept", kept, DType::I64, counts.shape());
  MCPP_CHECK(opt.capacity >= 0 && opt.capacity <= INT32_MAX, "{}: capacity {} out of range", op, opt.capacity);
  // scratch: each route's probability key and index, staged expert-major (ordered on the compute stream, as the
  // other ops' scratch)
  Tensor keys = Tensor::empty({topk.numel()}, DType::I32, Device::CUDA);
  Tensor route = Tensor::empty({topk.numel()}, DType::I32, Device::CUDA);
  launch_moe_capacity_positions(idx.data<int32_t>(), kept.data<int64_t>(), counts.data<int64_t>(),
                                probs.data<float>(), reinterpret_cast<uint32_t*>(keys.data<int32_t>()),
                                route.data<int32_t>(), topk.numel(), counts.numel(), opt.capacity, opt.by_probs,
                                opt.pad, stream_of(stream));
}

}  // namespace mcpp::ops::cuda
