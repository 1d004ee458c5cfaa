// CUDA vocab-parallel cross entropy pieces (ops.inc; semantics as kernels/cpu/vocab_parallel_cross_entropy.cpp),
// vocab_parallel_ce_kernels.cu. Logits float32 or bf16 [n, V/tp], read once; per-row tensors float32 [n].
// The combine steps (local_lse / rescale / finish) are one elementwise kernel each (logf / expf).
#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
float* row_vec(const char* op, const char* field, const Tensor& t, int64_t n) {
  require_float(op, field, t, /*bf16_ok=*/false);
  MCPP_CHECK(t.numel() == n, "{}: {} must be float32 [n={}]; got {}", op, field, n, t.str());
  return t.data<float>();
}
void check(const char* op, const Tensor& logits, const Tensor& targets) {
  require_float(op, "logits", logits);
  MCPP_CHECK(logits.ndim() == 2, "{}: logits must be [n, V/tp]; got {}", op, logits.str());
  require_i32(op, "targets", targets);
  MCPP_CHECK(targets.numel() == logits.size(0), "{}: targets must be int32 [n={}]; got {}", op, logits.size(0),
             targets.str());
}
}  // namespace

void vocab_parallel_ce_partials(Tensor& row_max, Tensor& sum_exp, Tensor& target_logit, const Tensor& logits,
                                const Tensor& targets, int64_t vocab_start, Stream stream) {
  const char* op = "vocab_parallel_ce_partials";
  check(op, logits, targets);
  const int64_t n = logits.size(0);
  launch_vocab_parallel_ce_partials(row_vec(op, "row_max", row_max, n), row_vec(op, "sum_exp", sum_exp, n),
                                    row_vec(op, "target_logit", target_logit, n), fin_of(op, "logits", logits),
                                    targets.data<int32_t>(), n, logits.size(1), vocab_start, stream_of(stream));
}

void vocab_parallel_ce_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                           const Tensor& lse, int64_t vocab_start, Stream stream) {
  const char* op = "vocab_parallel_ce_bwd";
  check(op, logits, targets);
  require_same_shape(op, "dlogits", dlogits, "logits", logits);
  const int64_t n = logits.size(0);
  launch_vocab_parallel_ce_bwd(fout_of(op, "dlogits", dlogits), row_vec(op, "dloss", dloss, n),
                               fin_of(op, "logits", logits), targets.data<int32_t>(), row_vec(op, "lse", lse, n), n,
                               logits.size(1), vocab_start, stream_of(stream));
}

void vocab_parallel_ce_local_lse(Tensor& local_lse, const Tensor& row_max, const Tensor& sum_exp, Stream stream) {
  const char* op = "vocab_parallel_ce_local_lse";
  const int64_t n = local_lse.numel();
  launch_vocab_parallel_ce_combine(0, row_vec(op, "local_lse", local_lse, n), row_vec(op, "row_max", row_max, n),
                                   row_vec(op, "sum_exp", sum_exp, n), nullptr, nullptr, n, stream_of(stream));
}

void vocab_parallel_ce_rescale(Tensor& scaled, const Tensor& local_lse, const Tensor& gmax, Stream stream) {
  const char* op = "vocab_parallel_ce_rescale";
  const int64_t n = scaled.numel();
  launch_vocab_parallel_ce_combine(1, row_vec(op, "scaled", scaled, n), row_vec(op, "local_lse", local_lse, n),
                                   row_vec(op, "gmax", gmax, n), nullptr, nullptr, n, stream_of(stream));
}

void vocab_parallel_ce_finish(Tensor& loss, Tensor& lse, const Tensor& gmax, const Tensor& sum_scaled,
                              const Tensor& target_logit, Stream stream) {
  const char* op = "vocab_parallel_ce_finish";
  const int64_t n = loss.numel();
  launch_vocab_parallel_ce_combine(2, row_vec(op, "loss", loss, n), row_vec(op, "gmax", gmax, n),
                                   row_vec(op, "sum_scaled", sum_scaled, n), row_vec(op, "target_logit", target_logit, n),
                                   row_vec(op, "lse", lse, n), n, stream_of(stream));
}

}  // namespace mcpp::ops::cuda
