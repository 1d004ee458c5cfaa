// CPU flash_attention_{fwd,bwd}_qkv (kernels/ops.inc): flash attention on Megatron's fused linear_qkv output
//   qkv[s, b, ng * (r + 2) * d] (per query group [q_0 .. q_{r-1}, k, v], r = nq / ng; kernels/packed_qkv.h)
// defined as exactly the composition it replaces, so results are bitwise those of the split path:
//   fwd: qkv_split -> q[s, b, nq, d], k/v[s, b, ng, d]; flash_attention_fwd -> o[s, b, nq, d], lse[b, nq, s]
//   bwd: qkv_split (the saved qkv); flash_attention_bwd -> dq, dk, dv; qkv_merge -> dqkv (OVERWRITTEN)
// float32 CPU tensors (the CPU attention's dtype). The split copies are temporaries of this call.
#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/kernels/packed_qkv.h"

namespace mcpp::ops::cpu {

void flash_attention_fwd_qkv(Tensor& o, Tensor& lse, const Tensor& qkv, int64_t num_query_groups,
                             const AttentionOptions& opt, Stream stream) {
  const char* op = "flash_attention_fwd_qkv";
  detail::require_cpu_f32(op, "qkv", qkv);
  const ops::detail::PackedQkvDims p = ops::detail::check_packed_qkv(op, "qkv", qkv, "o", o, num_query_groups);
  Tensor q = Tensor::empty(p.q_shape()), k = Tensor::empty(p.kv_shape()), v = Tensor::empty(p.kv_shape());
  cpu::qkv_split(q, k, v, qkv, stream);
  cpu::flash_attention_fwd(o, lse, q, k, v, opt, stream);
}

void flash_attention_bwd_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& o, const Tensor& lse,
                             int64_t num_query_groups, const AttentionOptions& opt, Stream stream) {
  const char* op = "flash_attention_bwd_qkv";
  detail::require_cpu_f32(op, "qkv", qkv);
  detail::require_cpu_f32(op, "dqkv", dqkv);
  const ops::detail::PackedQkvDims p = ops::detail::check_packed_qkv(op, "qkv", qkv, "dout", dout, num_query_groups);
  detail::require_same_shape(op, "dqkv", dqkv, "qkv", qkv);
  detail::require_same_shape(op, "o", o, "dout", dout);
  Tensor q = Tensor::empty(p.q_shape()), k = Tensor::empty(p.kv_shape()), v = Tensor::empty(p.kv_shape());
  cpu::qkv_split(q, k, v, qkv, stream);
  Tensor dq = Tensor::empty(p.q_shape()), dk = Tensor::empty(p.kv_shape()), dv = Tensor::empty(p.kv_shape());
  cpu::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt, stream);
  cpu::qkv_merge(dqkv, dq, dk, dv, stream);
}

}  // namespace mcpp::ops::cpu
