// CUDA scaled (causal-)masked softmax (Megatron's fused_scale_mask_softmax) and fused softmax cross
// entropy, softmax_kernels.cu. Semantics as kernels/cpu/softmax.cpp and cross_entropy.cpp:
//   scaled_masked_softmax_fwd: probs[rows, sq, sk] = softmax_k(scale * scores), causal masks key j > query i
//                              (needs sq == sk); masked probabilities are exactly 0.
//   scaled_masked_softmax_bwd: dscores = scale * probs * (dprobs - sum_k(dprobs * probs)).
//   cross_entropy_fwd: loss[n] = lse - logits[target], lse[n] float32 saved; logits float32 or bf16 [n, V],
//                      read once, never copied to fp32. A target outside [0, V) gives NaN loss (no host sync).
//   cross_entropy_bwd: dlogits = (softmax - onehot) * dloss; may alias logits.
//   cross_entropy_fwd_bwd: both in one kernel (row staged in shared memory) for bf16/f16 logits with the
//                      vector path and V <= kCeFusedMaxV; otherwise the two kernels above.
//   masked_loss_stats / masked_loss_grad: float32 [n] loss/mask/dloss, stats [2]; no host read-back.
// Outputs overwritten; float32 / bf16 I/O with float32 math. Asynchronous on stream_of(stream).
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
void check_3d(const char* op, const char* field, const Tensor& t) {
  require_float(op, field, t);
  MCPP_CHECK(t.ndim() == 3, "{}: {} must be [rows, sq, sk]; got {}", op, field, t.str());
}
void check_ce(const char* op, const Tensor& logits, const Tensor& targets) {
  require_float(op, "logits", logits);
  MCPP_CHECK(logits.ndim() == 2, "{}: logits must be [n, V]; got {}", op, logits.str());
  require_i32(op, "targets", targets);
  MCPP_CHECK(targets.ndim() == 1 && targets.size(0) == logits.size(0), "{}: targets must be int32 [n={}]; got {}", op,
             logits.size(0), targets.str());
}
float* vec(const char* op, const char* field, const Tensor& t, int64_t n) {
  require_float(op, field, t, /*bf16_ok=*/false);
  MCPP_CHECK(t.ndim() == 1 && t.size(0) == n, "{}: {} must be float32 [n={}]; got {}", op, field, n, t.str());
  return t.data<float>();
}
}  // namespace

void scaled_masked_softmax_fwd(Tensor& probs, const Tensor& scores, float scale, bool causal, Stream stream) {
  const char* op = "scaled_masked_softmax_fwd";
  check_3d(op, "scores", scores);
  check_3d(op, "probs", probs);
  require_same_shape(op, "probs", probs, "scores", scores);
  const int64_t rows = scores.size(0), sq = scores.size(1), sk = scores.size(2);
  MCPP_CHECK(!causal || sq == sk, "{}: causal mask needs sq == sk, got scores {}", op, scores.str());
  launch_softmax_fwd(fout_of(op, "probs", probs), fin_of(op, "scores", scores), rows, sq, sk, scale, causal,
                     stream_of(stream));
}

void scaled_masked_softmax_bwd(Tensor& dscores, const Tensor& dprobs, const Tensor& probs, float scale,
                               Stream stream) {
  const char* op = "scaled_masked_softmax_bwd";
  check_3d(op, "probs", probs);
  check_3d(op, "dprobs", dprobs);
  check_3d(op, "dscores", dscores);
  require_same_shape(op, "dprobs", dprobs, "probs", probs);
  require_same_shape(op, "dscores", dscores, "probs", probs);
  launch_softmax_bwd(fout_of(op, "dscores", dscores), fin_of(op, "dprobs", dprobs), fin_of(op, "probs", probs),
                     probs.size(0) * probs.size(1), probs.size(2), scale, stream_of(stream));
}

void cross_entropy_fwd(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets, Stream stream) {
  const char* op = "cross_entropy_fwd";
  check_ce(op, logits, targets);
  const int64_t n = logits.size(0);
  launch_cross_entropy_fwd(vec(op, "loss", loss, n), vec(op, "lse", lse, n), fin_of(op, "logits", logits),
                           targets.data<int32_t>(), n, logits.size(1), stream_of(stream));
}

void cross_entropy_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                       const Tensor& lse, Stream stream) {
  const char* op = "cross_entropy_bwd";
  check_ce(op, logits, targets);
  const int64_t n = logits.size(0);
  require_same_shape(op, "dlogits", dlogits, "logits", logits);
  launch_cross_entropy_bwd(fout_of(op, "dlogits", dlogits), vec(op, "dloss", dloss, n), fin_of(op, "logits", logits),
                           targets.data<int32_t>(), vec(op, "lse", lse, n), n, logits.size(1), stream_of(stream));
}

void cross_entropy_fwd_bwd(Tensor& loss, Tensor& lse, Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           const Tensor& dloss, Stream stream) {
  const char* op = "cross_entropy_fwd_bwd";
  check_ce(op, logits, targets);
  const int64_t n = logits.size(0);
  require_same_shape(op, "dlogits", dlogits, "logits", logits);
  if (launch_cross_entropy_fwd_bwd(vec(op, "loss", loss, n), vec(op, "lse", lse, n), fout_of(op, "dlogits", dlogits),
                                   vec(op, "dloss", dloss, n), fin_of(op, "logits", logits), targets.data<int32_t>(),
                                   n, logits.size(1), stream_of(stream)))
    return;
  cross_entropy_fwd(loss, lse, logits, targets, stream);
  cross_entropy_bwd(dlogits, dloss, logits, targets, lse, stream);
}

void masked_loss_stats(Tensor& stats, const Tensor& loss, const Tensor& mask, Stream stream) {
  const char* op = "masked_loss_stats";
  const int64_t n = last_dim(op, "loss", loss);
  MCPP_CHECK(loss.ndim() == 1, "{}: loss must be [n]; got {}", op, loss.str());
  launch_masked_loss_stats(vec(op, "stats", stats, 2), vec(op, "loss", loss, n), vec(op, "mask", mask, n), n,
                           stream_of(stream));
}

void masked_loss_grad(Tensor& dloss, const Tensor& mask, const Tensor& stats, float grad_scale, bool per_token,
                      Stream stream) {
  const char* op = "masked_loss_grad";
  const int64_t n = last_dim(op, "mask", mask);
  MCPP_CHECK(mask.ndim() == 1, "{}: mask must be [n]; got {}", op, mask.str());
  launch_masked_loss_grad(vec(op, "dloss", dloss, n), vec(op, "mask", mask, n), vec(op, "stats", stats, 2),
                          grad_scale, per_token, n, stream_of(stream));
}

}  // namespace mcpp::ops::cuda
