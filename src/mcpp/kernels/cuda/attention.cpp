// CUDA flash attention, forward and backward (attention_kernels.cu), semantics of kernels/cpu/attention.cpp:
//   flash_attention_fwd: q[s, b, nq, d], k/v[s, b, ng, d] -> o[s, b, nq, d], lse float32 [b, nq, s];
//     o_i = sum_j softmax_j(scale q_i.k_j) v_j over keys j (j <= i when causal); query head h reads kv group
//     h / (nq / ng). d: any multiple of 8 up to 256.
//   flash_attention_bwd: dq[s, b, nq, d], dk/dv[s, b, ng, d] (OVERWRITTEN; dk/dv sum over a group's heads),
//     from dout and the saved o, lse; a float32 [b, nq, s] scratch holds delta = rowsum(dout * o).
// Dispatch: when every tensor of the call (q, k, v, o; bwd also dout, dq, dk, dv) is bf16, contiguous and
// 16-byte aligned: cuDNN's fused flash attention (cudnn_attention.h; opt.deterministic: its deterministic
// backward graph) unless ops::cuda::set_cudnn_attention(false) or cuDNN has no engine for the shape (same
// lse semantics, so a forward and a backward may take different paths), else, for d = 64 / 128, the
// tensor-core kernels (attention_mma_{fwd,bwd}_kernels.cu: mma.sync bf16, fp32 accumulate, P and dS rounded
// to bf16 before their products as in FlashAttention-2; deterministic).
// Otherwise — float32 / mixed dtypes, and bf16 calls of other head dims that cuDNN does not take — the
// CUDA-core kernels (attention_kernels.cu, templated on d rounded up to a multiple of 32, the columns past d
// masked): q/k/v/o and grads float32 or bf16, each tensor may differ (rounded on store), math float32,
// deterministic; their grid limits s to 65535 tiles of 16 queries.
// Attention dropout (opt.dropout_p > 0): cuDNN's graphs with its RNG node where it has an engine for the
// forward and both backwards (its Philox numbers: another mask than the CPU's); otherwise (and with
// set_cudnn_attention(false)) the mcpp kernels (tensor-core or fp32) draw the CPU's mask in-tile from
// opt.dropout_key, bit for bit (attention_dropout.h).
// Document masking (opt.doc_start, packed sequences): the CUDA-core kernels, masked per (query, key) by the
// query's document start (cuDNN's ragged layout and the tensor-core kernels do not read it yet).
// Never materializes [s, s]. Asynchronous on stream_of(stream) (the delta scratch is freed stream-ordered).
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/cuda/attention_dropout.h"
#include "mcpp/kernels/cuda/cudnn_attention.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
std::atomic<bool> g_cudnn_attention{true};

AttnShape check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                    const AttentionOptions& opt) {
  require_float(op, "q", q);
  require_float(op, "k", k);
  require_float(op, "v", v);
  MCPP_CHECK(q.ndim() == 4, "{}: q must be [s, b, nq, d]; got {}", op, q.str());
  MCPP_CHECK(k.ndim() == 4 && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
             "{}: k must be [s, b, ng, d] matching q {}; got {}", op, q.str(), k.str());
  require_same_shape(op, "v", v, "k", k);
  AttnShape a{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), opt.softmax_scale, opt.causal};
  MCPP_CHECK(a.ng > 0 && a.nq % a.ng == 0, "{}: query heads nq={} must be a multiple of kv groups ng={}", op, a.nq,
             a.ng);
  a.split_layout();
  set_attention_dropout(op, a, opt);
  check_attention_doc_start(op, opt, a.b, a.s, Device::CUDA);
  if (opt.doc_start.defined()) a.doc = opt.doc_start.data<int32_t>();
  MCPP_CHECK(a.d > 0 && a.d % 8 == 0 && a.d <= 256,
             "{}: head dim d must be a multiple of 8 up to 256 on CUDA; got q {}", op, q.str());
  MCPP_CHECK((a.s + 63) / 64 <= 65535, "{}: sequence length s={} exceeds the launch grid", op, a.s);
  require_float(op, "lse", lse, /*bf16_ok=*/false);
  MCPP_CHECK(lse.shape() == Shape({a.b, a.nq, a.s}), "{}: lse must be float32 [b={}, nq={}, s={}]; got {}", op, a.b,
             a.nq, a.s, lse.str());
  return a;
}

// The tensor-core kernels are built for d = 64 and 128; other head dims take cuDNN or the CUDA-core kernels.
bool mma_head_dim(const AttnShape& a) { return a.d == 64 || a.d == 128; }

// The tensor-core path takes the call when every tensor is bf16 and 16-byte aligned (tensors are contiguous).
bool mma_path(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->dtype() != DType::BF16 || reinterpret_cast<uintptr_t>(t->raw()) % 16 != 0)
      return false;
  return true;
}

// The CUDA-core kernels' grid: y = tiles of 16 queries (keys in the dK/dV pass), at most 65535.
void check_fallback_grid(const char* op, const AttnShape& a) {
  MCPP_CHECK((a.s + 15) / 16 <= 65535,
             "{}: sequence length s={} exceeds the CUDA-core attention kernels' launch grid (65535 tiles of 16)", op,
             a.s);
}
}  // namespace

void set_cudnn_attention(bool on) { g_cudnn_attention = on; }
bool cudnn_attention() { return g_cudnn_attention; }

void set_attention_dropout(const char* op, AttnShape& a, const AttentionOptions& opt) {
  MCPP_CHECK(opt.dropout_p >= 0.0f && opt.dropout_p < 1.0f,
             "{}: attention dropout probability must be in [0, 1); got {}", op, opt.dropout_p);
  a.drop_p = opt.dropout_p;
  a.drop_seed = opt.dropout_key.seed;
  a.drop_offset = opt.dropout_key.offset;
  a.drop_base = opt.dropout_key.device_base;
  check_attention_dropout_block(op, opt, a.s);
  a.drop_s = opt.dropout_seq_length > 0 ? opt.dropout_seq_length : a.s;
  a.drop_i0 = opt.dropout_row_offset;
  a.drop_j0 = opt.dropout_col_offset;
  a.drop_aligned = a.drop_s % 4 == 0 && a.drop_j0 % 4 == 0;
}

bool dropout_block_of_larger_mask(const AttnShape& a) {
  return a.drop_p > 0.0f && (a.drop_s != a.s || a.drop_i0 != 0 || a.drop_j0 != 0);
}

void flash_attention_fwd(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                         const AttentionOptions& opt, Stream stream) {
  const char* op = "flash_attention_fwd";
  const AttnShape a = check_qkv(op, q, k, v, lse, opt);
  require_same_shape(op, "o", o, "q", q);
  if (!a.doc && mma_path({&o, &q, &k, &v})) {
    if (cudnn_attention() && !dropout_block_of_larger_mask(a) &&
        cudnn_attention_fwd(o.raw(), lse.data<float>(), q.raw(), k.raw(), v.raw(), a, stream_of(stream)))
      return;
    if (mma_head_dim(a)) {
      launch_attention_fwd_mma(o.raw(), lse.data<float>(), q.raw(), k.raw(), v.raw(), a, stream_of(stream));
      return;
    }
  }
  check_fallback_grid(op, a);
  launch_attention_fwd(fout_of(op, "o", o), lse.data<float>(), fin_of(op, "q", q), fin_of(op, "k", k),
                       fin_of(op, "v", v), a, stream_of(stream));
}

void flash_attention_bwd(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout, const Tensor& q, const Tensor& k,
                         const Tensor& v, const Tensor& o, const Tensor& lse, const AttentionOptions& opt,
                         Stream stream) {
  const char* op = "flash_attention_bwd";
  const AttnShape a = check_qkv(op, q, k, v, lse, opt);
  require_same_shape(op, "o", o, "q", q);
  require_same_shape(op, "dout", dout, "q", q);
  require_same_shape(op, "dq", dq, "q", q);
  require_same_shape(op, "dk", dk, "k", k);
  require_same_shape(op, "dv", dv, "v", v);
  cudaStream_t s = stream_of(stream);
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));  // scratch allocated there
  Tensor delta = Tensor::empty({a.b, a.nq, a.s}, DType::F32, Device::CUDA);  // rowsum(dout * o)
  const bool mma = !a.doc && mma_path({&dq, &dk, &dv, &dout, &q, &k, &v, &o});
  const bool cudnn = mma && cudnn_attention() && !dropout_block_of_larger_mask(a) &&
                     cudnn_attention_bwd(dq.raw(), dk.raw(), dv.raw(), dout.raw(), q.raw(), k.raw(), v.raw(), o.raw(),
                                         lse.data<float>(), delta.data<float>(), a, opt.deterministic, s);
  if (!cudnn && mma && mma_head_dim(a)) {
    launch_attention_bwd_mma(dq.raw(), dk.raw(), dv.raw(), dout.raw(), q.raw(), k.raw(), v.raw(), o.raw(),
                             lse.data<float>(), delta.data<float>(), a, s);
  } else if (!cudnn) {
    check_fallback_grid(op, a);
    launch_attention_bwd(fout_of(op, "dq", dq), fout_of(op, "dk", dk), fout_of(op, "dv", dv), fin_of(op, "dout", dout),
                         fin_of(op, "q", q), fin_of(op, "k", k), fin_of(op, "v", v), fin_of(op, "o", o),
                         lse.data<float>(), delta.data<float>(), a, s);
  }
  if (s != compute_stream()) MCPP_CUDA_CHECK(cudaStreamSynchronize(s));  // before delta is freed on compute_stream
}

void attention_merge(Tensor& o_acc, Tensor& lse_acc, const Tensor& o_blk, const Tensor& lse_blk, Stream stream) {
  const char* op = "attention_merge";
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"o_acc", &o_acc}, {"lse_acc", &lse_acc},
                                {"lse_blk", &lse_blk}})
    MCPP_CHECK(t->defined() && t->device() == Device::CUDA && t->dtype() == DType::F32,
               "{}: {} must be a float32 CUDA tensor; got {}", op, name, t->defined() ? t->str() : "undefined");
  MCPP_CHECK(o_acc.ndim() == 4, "{}: o_acc must be [s, b, nq, d]; got {}", op, o_acc.str());
  require_same_shape(op, "o_blk", o_blk, "o_acc", o_acc);
  const int64_t s = o_acc.size(0), b = o_acc.size(1), nq = o_acc.size(2), d = o_acc.size(3);
  MCPP_CHECK(lse_acc.shape() == Shape({b, nq, s}), "{}: lse_acc must be [b, nq, s] = [{}, {}, {}]; got {}", op, b,
             nq, s, lse_acc.str());
  require_same_shape(op, "lse_blk", lse_blk, "lse_acc", lse_acc);
  launch_attention_merge(o_acc.data<float>(), lse_acc.data<float>(), fin_of(op, "o_blk", o_blk),
                         lse_blk.data<float>(), s, b * nq, d, stream_of(stream));
}

}  // namespace mcpp::ops::cuda
