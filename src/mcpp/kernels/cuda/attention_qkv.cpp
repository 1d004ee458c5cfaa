// CUDA flash_attention_{fwd,bwd}_qkv (kernels/ops.inc; semantics of kernels/cpu/attention_qkv.cpp): flash
// attention on Megatron's fused linear_qkv output
//   qkv[s, b, ng * (r + 2) * d], per query group [q_0 .. q_{r-1}, k, v], r = nq / ng (kernels/packed_qkv.h)
//   fwd: -> o[s, b, nq, d], lse float32 [b, nq, s];  bwd: dout, the saved qkv / o / lse -> dqkv (qkv's shape,
//   OVERWRITTEN: every element is dq, dk or dv). d: a multiple of 8 up to 256.
// Dispatch, for bf16 qkv, o (bwd also dqkv, dout), 16-byte aligned — in place, no split / merge copies, the
// fused rows addressed through AttnShape::packed_layout() (q pointer = qkv, k = qkv + r d, v = k + d; dq/dk/dv
// the same inside dqkv):
//   the split op's default, cuDNN's fused attention (cudnn_attention.h; opt.deterministic: its deterministic
//     backward graph), with the packed strides. Where it has no engine for them (packed GQA has no uniform
//     head stride; or a refused plan) the composition below runs, whose split layout cuDNN does take —
//     never slower than the split path;
//   with ops::cuda::set_cudnn_attention(false), d = 64 / 128: the mcpp tensor-core kernels
//     (attention_mma_{fwd,bwd}_kernels.cu) — the same arithmetic as the split path, so results are bitwise those
//     of qkv_split + flash_attention_fwd (bwd: + qkv_merge).
// Everything else (fp32, mixed dtypes, unaligned; other head dims without cuDNN) and those cases: the explicit
// composition qkv_split + flash_attention_fwd (bwd: + qkv_merge) with temporaries.
// Asynchronous on stream_of(stream); temporaries are freed stream-ordered on compute_stream() (when the op
// runs on another stream, it synchronizes around them, like flash_attention_bwd's delta scratch).
#include <cstdint>
#include <initializer_list>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/cuda/attention_dropout.h"
#include "mcpp/kernels/cuda/cudnn_attention.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/kernels/packed_qkv.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;
using ops::detail::PackedQkvDims;

namespace {

AttnShape packed_shape(const char* op, const PackedQkvDims& p, const Tensor& lse, const AttentionOptions& opt) {
  MCPP_CHECK(p.d > 0 && p.d % 8 == 0 && p.d <= 256, "{}: head dim d must be a multiple of 8 up to 256 on CUDA; got d={}",
             op, p.d);
  MCPP_CHECK((p.s + 63) / 64 <= 65535, "{}: sequence length s={} exceeds the launch grid", op, p.s);
  require_float(op, "lse", lse, /*bf16_ok=*/false);
  MCPP_CHECK(lse.shape() == p.lse_shape(), "{}: lse must be float32 [b={}, nq={}, s={}]; got {}", op, p.b, p.nq, p.s,
             lse.str());
  AttnShape a{p.s, p.b, p.nq, p.ng, p.d, opt.softmax_scale, opt.causal};
  a.packed_layout();
  set_attention_dropout(op, a, opt);
  return a;
}

// The in-place (packed) dispatch applies: every tensor bf16 and 16-byte aligned (tensors are contiguous;
// the k / v offsets r d and (r + 1) d are multiples of 8 elements because d is).
bool in_place_ok(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype() != DType::BF16 || reinterpret_cast<uintptr_t>(t->raw()) % 16 != 0) return false;
  return true;
}

// The three head views' base pointers inside a packed [s, b, ng, (r + 2) d] bf16 buffer.
struct PackedPtrs {
  char *q, *k, *v;
};
PackedPtrs packed_ptrs(const Tensor& t, const PackedQkvDims& p) {
  char* base = static_cast<char*>(t.raw());
  const int64_t row = p.d * static_cast<int64_t>(sizeof(uint16_t));  // one bf16 head row, in bytes
  return {base, base + p.r() * row, base + (p.r() + 1) * row};
}

// Orders this call's compute_stream() temporaries against a caller stream `s` (see the file header).
struct StreamFence {
  cudaStream_t s;
  explicit StreamFence(cudaStream_t st) : s(st) {
    if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  }
  void done() const {
    if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(s));
  }
};

}  // namespace

void flash_attention_fwd_qkv(Tensor& o, Tensor& lse, const Tensor& qkv, int64_t num_query_groups,
                             const AttentionOptions& opt, Stream stream) {
  const char* op = "flash_attention_fwd_qkv";
  require_float(op, "qkv", qkv);
  require_float(op, "o", o);
  const PackedQkvDims p = ops::detail::check_packed_qkv(op, "qkv", qkv, "o", o, num_query_groups);
  const AttnShape a = packed_shape(op, p, lse, opt);
  const cudaStream_t s = stream_of(stream);
  const bool mma_head_dim = p.d == 64 || p.d == 128;  // the tensor-core kernels' head dims
  const bool mcpp_kernels = !cudnn_attention() || dropout_block_of_larger_mask(a);
  if (!opt.doc_start.defined() && in_place_ok({&o, &qkv})) {  // (documents: the split op's CUDA-core kernels)
    const PackedPtrs in = packed_ptrs(qkv, p);
    if (mcpp_kernels && mma_head_dim) {
      launch_attention_fwd_mma(o.raw(), lse.data<float>(), in.q, in.k, in.v, a, s);
      return;
    }
    if (!mcpp_kernels && cudnn_attention_fwd(o.raw(), lse.data<float>(), in.q, in.k, in.v, a, s)) return;
  }
  // The composition the op is defined as (fp32 / mixed dtypes / unaligned, other head dims on the mcpp kernels,
  // or cuDNN refused the packed strides: its split form may still run on cuDNN).
  const StreamFence fence(s);
  {
    Tensor q = Tensor::empty(p.q_shape(), qkv.dtype(), Device::CUDA);  // [s, b, nq, d]
    Tensor k = Tensor::empty(p.kv_shape(), qkv.dtype(), Device::CUDA);  // [s, b, ng, d]
    Tensor v = Tensor::empty(p.kv_shape(), qkv.dtype(), Device::CUDA);
    cuda::qkv_split(q, k, v, qkv, stream);
    cuda::flash_attention_fwd(o, lse, q, k, v, opt, stream);
    fence.done();
  }
}

void flash_attention_bwd_qkv(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& o, const Tensor& lse,
                             int64_t num_query_groups, const AttentionOptions& opt, Stream stream) {
  const char* op = "flash_attention_bwd_qkv";
  require_float(op, "qkv", qkv);
  require_float(op, "dqkv", dqkv);
  require_float(op, "dout", dout);
  require_float(op, "o", o);
  const PackedQkvDims p = ops::detail::check_packed_qkv(op, "qkv", qkv, "dout", dout, num_query_groups);
  require_same_shape(op, "dqkv", dqkv, "qkv", qkv);
  require_same_shape(op, "o", o, "dout", dout);
  const AttnShape a = packed_shape(op, p, lse, opt);
  const cudaStream_t s = stream_of(stream);
  const StreamFence fence(s);
  const bool mma_head_dim = p.d == 64 || p.d == 128;  // the tensor-core kernels' head dims
  const bool mcpp_kernels = !cudnn_attention() || dropout_block_of_larger_mask(a);
  if (!opt.doc_start.defined() && in_place_ok({&dqkv, &dout, &qkv, &o}) && (!mcpp_kernels || mma_head_dim)) {
    Tensor delta = Tensor::empty(p.lse_shape(), DType::F32, Device::CUDA);  // rowsum(dout * o) scratch
    const PackedPtrs in = packed_ptrs(qkv, p), out = packed_ptrs(dqkv, p);
    bool done = false;
    if (mcpp_kernels) {
      launch_attention_bwd_mma(out.q, out.k, out.v, dout.raw(), in.q, in.k, in.v, o.raw(), lse.data<float>(),
                               delta.data<float>(), a, s);
      done = true;
    } else {
      done = cudnn_attention_bwd(out.q, out.k, out.v, dout.raw(), in.q, in.k, in.v, o.raw(), lse.data<float>(),
                                 delta.data<float>(), a, opt.deterministic, s);
    }
    if (done) {
      fence.done();
      return;
    }
  }
  // The composition: split the saved qkv, the split-layout backward, merge into dqkv.
  Tensor q = Tensor::empty(p.q_shape(), qkv.dtype(), Device::CUDA);  // [s, b, nq, d]
  Tensor k = Tensor::empty(p.kv_shape(), qkv.dtype(), Device::CUDA);  // [s, b, ng, d]
  Tensor v = Tensor::empty(p.kv_shape(), qkv.dtype(), Device::CUDA);
  Tensor dq = Tensor::empty(p.q_shape(), dqkv.dtype(), Device::CUDA);
  Tensor dk = Tensor::empty(p.kv_shape(), dqkv.dtype(), Device::CUDA);
  Tensor dv = Tensor::empty(p.kv_shape(), dqkv.dtype(), Device::CUDA);
  cuda::qkv_split(q, k, v, qkv, stream);
  cuda::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt, stream);
  cuda::qkv_merge(dqkv, dq, dk, dv, stream);
  fence.done();
}

}  // namespace mcpp::ops::cuda
