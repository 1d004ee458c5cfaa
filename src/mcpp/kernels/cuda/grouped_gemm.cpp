// CUDA grouped GEMMs of the MoE experts (ops.inc grouped_linear_*). Counts on the device: kernels in
// grouped_gemm_kernels.cu, one launch per op for every group, the group sizes read on the device (int64 [G]; never on
// the host, so a captured step replays with new counts; the fused GELU ops: that GEMM, then gelu_fwd / gelu_bwd).
// Counts on the host: cuBLASLt (grouped_gemm_lt.h, GELU and gelu' in its epilogues).
// Shapes, dtypes and devices are checked here (ops::check_grouped_linear); the device counts' values are not (they
// must be >= 0 and sum to the buffer's rows: the router's counts are). bf16 operands with widths that are multiples of
// 8 and 16-byte aligned pointers run the tensor-core kernel, anything else the FMA kernel. Async on stream_of(stream).
#include <cstdint>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/cuda/grouped_gemm_launch.h"
#include "mcpp/kernels/cuda/grouped_gemm_lt.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
static_assert(kMaxGroupedGemmGroups == kMaxGemmGroups);

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Every weight (and the bias, when given) of the activations' dtype; returns that Kind.
Kind check_kinds(const char* op, const Tensor& x, const Tensor& y, const std::vector<Tensor>& w,
                 const std::vector<Tensor>& bias) {
  const Kind k = require_float(op, "x", x);
  MCPP_CHECK(y.dtype() == x.dtype(), "{}: the activations must have one dtype; got {} and {}", op, x.str(), y.str());
  for (const Tensor& t : w)
    MCPP_CHECK(t.dtype() == x.dtype(), "{}: the weights must have the activations' dtype; got {} for {}", op, t.str(),
               x.str());
  for (const Tensor& t : bias)
    MCPP_CHECK(t.dtype() == x.dtype(), "{}: the biases must have the activations' dtype; got {} for {}", op, t.str(),
               x.str());
  return k;
}

// pre_act: the output's shape and dtype (the GELU's input kept for backward).
void check_pre_act(const char* op, const Tensor& pre_act, const Tensor& out) {
  MCPP_CHECK(pre_act.shape() == out.shape() && pre_act.dtype() == out.dtype() && pre_act.device() == out.device(),
             "{}: pre_act must have the output's shape, dtype and device; got {} and {}", op, pre_act.str(), out.str());
}

// The tensor-core kernel's conditions: bf16, the widths multiples of 8 (16-byte chunks), the operands 16-byte aligned.
bool tensor_cores(Kind k, const GroupedLinearShape& s, std::initializer_list<const void*> operands,
                  const std::vector<Tensor>& w) {
  if (k != kBF16 || s.in % 8 != 0 || s.out % 8 != 0) return false;
  for (const void* p : operands)
    if (!aligned16(p)) return false;
  for (const Tensor& t : w)
    if (!aligned16(t.raw())) return false;
  return true;
}
}  // namespace

void grouped_linear_fwd(Tensor& y, const Tensor& x, const std::vector<Tensor>& w, const std::vector<Tensor>& bias,
                        const Tensor& counts, Stream stream) {
  const GroupedLinearShape s = check_grouped_linear("grouped_linear_fwd", x, y, w, bias, counts);
  const Kind k = check_kinds("grouped_linear_fwd", x, y, w, bias);
  if (counts.device() == Device::CPU) return grouped_lt::fwd(y, x, w, bias, counts, stream_of(stream));
  // C[rows, out] = A[rows, in] (k-major) B, B(k, n) = w_g[n, k] (k-major); groups split the rows
  GroupedGemmArgs a{.counts = counts.data<int64_t>(), .groups = static_cast<int>(s.groups), .group_rows_m = true,
                    .a_kmajor = true, .b_kmajor = true, .overwrite = true, .in_kind = k, .out_kind = k,
                    .bias_kind = k, .rows = s.m, .M = s.m, .N = s.out, .K = s.in, .lda = s.in, .ldb = s.in,
                    .ldc = s.out, .a = x.raw(), .b = {}, .c = {}, .bias = {}};
  a.c[0] = y.raw();
  for (int64_t g = 0; g < s.groups; ++g) {
    a.b[g] = w[static_cast<size_t>(g)].raw();
    a.bias[g] = bias.empty() ? nullptr : bias[static_cast<size_t>(g)].raw();
  }
  launch_grouped_gemm(a, tensor_cores(k, s, {x.raw()}, w), stream_of(stream));
}

void grouped_linear_gelu_fwd(Tensor& act, Tensor& pre_act, const Tensor& x, const std::vector<Tensor>& w,
                             const std::vector<Tensor>& bias, const Tensor& counts, Stream stream) {
  check_grouped_linear("grouped_linear_gelu_fwd", x, act, w, bias, counts);
  check_kinds("grouped_linear_gelu_fwd", x, act, w, bias);
  check_pre_act("grouped_linear_gelu_fwd", pre_act, act);
  if (counts.device() == Device::CPU) return grouped_lt::gelu_fwd(act, pre_act, x, w, bias, counts, stream_of(stream));
  grouped_linear_fwd(pre_act, x, w, bias, counts, stream);  // the grouped kernel, then GELU over the buffer
  gelu_fwd(act, pre_act, stream);
}

void grouped_linear_dgelu_bwd(Tensor& dpre, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& pre_act,
                              const Tensor& counts, Stream stream) {
  check_grouped_linear("grouped_linear_dgelu_bwd", dpre, dy, w, {}, counts);
  check_kinds("grouped_linear_dgelu_bwd", dy, dpre, w, {});
  check_pre_act("grouped_linear_dgelu_bwd", pre_act, dpre);
  if (counts.device() == Device::CPU) return grouped_lt::dgelu_bwd(dpre, dy, w, pre_act, counts, stream_of(stream));
  grouped_linear_dgrad(dpre, dy, w, counts, stream);  // the grouped kernel, then gelu' in place
  gelu_bwd(dpre, dpre, pre_act, stream);
}

void grouped_linear_dgrad(Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& counts,
                          Stream stream) {
  const GroupedLinearShape s = check_grouped_linear("grouped_linear_dgrad", dx, dy, w, {}, counts);
  const Kind k = check_kinds("grouped_linear_dgrad", dy, dx, w, {});
  if (counts.device() == Device::CPU) return grouped_lt::dgrad(dx, dy, w, counts, stream_of(stream));
  // C[rows, in] = A[rows, out] (k-major) B, B(k = o, n = i) = w_g[o, i] (n-major); groups split the rows
  GroupedGemmArgs a{.counts = counts.data<int64_t>(), .groups = static_cast<int>(s.groups), .group_rows_m = true,
                    .a_kmajor = true, .b_kmajor = false, .overwrite = true, .in_kind = k, .out_kind = k,
                    .bias_kind = k, .rows = s.m, .M = s.m, .N = s.in, .K = s.out, .lda = s.out, .ldb = s.in,
                    .ldc = s.in, .a = dy.raw(), .b = {}, .c = {}, .bias = {}};
  a.c[0] = dx.raw();
  for (int64_t g = 0; g < s.groups; ++g) a.b[g] = w[static_cast<size_t>(g)].raw();
  launch_grouped_gemm(a, tensor_cores(k, s, {dy.raw()}, w), stream_of(stream));
}

void grouped_linear_wgrad(std::vector<Tensor>& dw_acc, std::vector<Tensor>& db_acc, const Tensor& dy, const Tensor& x,
                          const Tensor& counts, GradWrite grad_write, Stream stream) {
  const char* op = "grouped_linear_wgrad";
  const std::vector<Tensor> dws(dw_acc.begin(), dw_acc.end()), dbs(db_acc.begin(), db_acc.end());
  const GroupedLinearShape s = check_grouped_linear(op, x, dy, dws, dbs, counts);
  const Kind k = require_float(op, "x", x);
  MCPP_CHECK(dy.dtype() == x.dtype(), "{}: dy and x must have one dtype; got {} and {}", op, dy.str(), x.str());
  const Kind kw = require_float(op, "dw_acc", dw_acc[0]);
  for (const Tensor& t : dws)
    MCPP_CHECK(t.dtype() == dw_acc[0].dtype() && (t.dtype() == DType::F32 || t.dtype() == x.dtype()),
               "{}: the weight grads must be float32 or the activations' dtype, all one; got {}", op, t.str());
  const bool overwrite = grad_write == GradWrite::Overwrite;
  for (const Tensor& t : dbs)
    MCPP_CHECK(t.dtype() == dbs[0].dtype(), "{}: the bias grads must have one dtype; got {}", op, t.str());
  if (counts.device() == Device::CPU)
    return grouped_lt::wgrad(dw_acc, db_acc, dy, x, counts, overwrite, stream_of(stream));
  // C_g[out, in] = A[out, rows_g] B[rows_g, in]: A(m = o, k = r) = dy[r, o] (m-major), B(k = r, n = i) = x[r, i]
  // (n-major); groups split the reduction
  GroupedGemmArgs a{.counts = counts.data<int64_t>(), .groups = static_cast<int>(s.groups), .group_rows_m = false,
                    .a_kmajor = false, .b_kmajor = false, .overwrite = overwrite, .in_kind = k, .out_kind = kw,
                    .bias_kind = k, .rows = s.m, .M = s.out, .N = s.in, .K = 0, .lda = s.out, .ldb = s.in,
                    .ldc = s.in, .a = dy.raw(), .b = {}, .c = {}, .bias = {}};
  a.b[0] = x.raw();
  for (int64_t g = 0; g < s.groups; ++g) a.c[g] = dw_acc[static_cast<size_t>(g)].raw();
  launch_grouped_gemm(a, tensor_cores(k, s, {dy.raw(), x.raw()}, {}), stream_of(stream));
  if (db_acc.empty()) return;
  const Kind kb = require_float(op, "db_acc", db_acc[0]);
  GroupedBiasGradArgs b{.counts = counts.data<int64_t>(), .groups = static_cast<int>(s.groups),
                        .overwrite = overwrite, .db_kind = kb, .n = s.out, .dy = FIn{dy.raw(), k}, .db = {},
                        .row_lo = {}};
  for (int64_t g = 0; g < s.groups; ++g) b.db[g] = db_acc[static_cast<size_t>(g)].raw();
  launch_grouped_bias_grad(b, stream_of(stream));
}

}  // namespace mcpp::ops::cuda
