// Argument checks shared by the CPU kernels (kernels/cpu/*.cpp): each failure is an mcpp::Error that
// names the op, the argument and the shapes involved, e.g.
//   "layernorm_fwd: gamma must have 768 elements (hidden = x.size(-1)); got Tensor[float32, cpu, (512)]".
#pragma once
#include <algorithm>
#include <cstdint>

#include "mcpp/core/error.h"
#include "mcpp/core/tensor.h"

namespace mcpp::ops::cpu::detail {

inline void require_cpu_f32(const char* op, const char* arg, const Tensor& t) {
  MCPP_CHECK(t.defined(), "{}: {} is an undefined tensor", op, arg);
  MCPP_CHECK(t.is_cpu(), "{}: {} must be a CPU tensor; got {}", op, arg, t.str());
  MCPP_CHECK(t.dtype() == DType::F32, "{}: {} must be float32; got {}", op, arg, t.str());
}

inline void require_numel(const char* op, const char* arg, const Tensor& t, int64_t numel, const char* why) {
  MCPP_CHECK(t.numel() == numel, "{}: {} must have {} elements ({}); got {}", op, arg, numel, why, t.str());
}

inline void require_same_shape(const char* op, const char* arg, const Tensor& t, const char* ref_name,
                               const Tensor& ref) {
  MCPP_CHECK(t.shape() == ref.shape(), "{}: {} must have the shape of {} {}; got {}", op, arg, ref_name,
             shape_str(ref.shape()), t.str());
}

// Last dimension of a tensor with at least one dim (the hidden / feature dim of row-wise ops).
inline int64_t last_dim(const char* op, const char* arg, const Tensor& t) {
  MCPP_CHECK(t.ndim() >= 1, "{}: {} must have at least one dimension; got {}", op, arg, t.str());
  return t.size(-1);
}

// db[out] += the column sums of dy2 [n, out] (fp32), summed in double per column over all rows in order
// (gemm.cpp: linear_bwd's bias grad; also the norms' residual bias sums).
void column_sum_acc(Tensor& db, const Tensor& dy2);

// An FP8 linear backward's operands (fp8.cpp, fp8_block.cpp): dw_acc float32 like w [out, in], dy [n, out] and
// x [n, in]. Returns n.
inline int64_t linear_bwd_rows(const char* op, const Tensor& dw_acc, const Tensor& dy, const Tensor& x,
                               const Tensor& w) {
  require_cpu_f32(op, "dw_acc", dw_acc);
  MCPP_CHECK(w.ndim() == 2 && dw_acc.shape() == w.shape(), "{}: w [out, in] and dw_acc like w; got w {}, dw_acc {}",
             op, w.str(), dw_acc.str());
  const int64_t out = w.size(0), in = w.size(1), n = x.numel() / std::max<int64_t>(in, 1);
  MCPP_CHECK(dy.numel() == n * out && x.numel() == n * in, "{}: dy [n, {}] and x [n, {}]; got dy {}, x {}", op, out,
             in, dy.str(), x.str());
  return n;
}

// An FP8 linear backward's last step: dw_acc = prod * alpha (overwrite) or dw_acc += prod * alpha — the product
// rounded once, then added, as cuBLASLt's beta = 1 — and db_acc (when given) = / += the column sums of dy2 [n, out].
void add_linear_grads(const char* op, Tensor& dw_acc, const Tensor& prod, float alpha, Tensor* db_acc,
                      const Tensor& dy2, bool overwrite);

}  // namespace mcpp::ops::cpu::detail
