// CUDA FP8 ops (ops.inc fp8_*): argument checks, fp8 byte scratch, and the cuBLASLt FP8 GEMMs.
//
// cuBLASLt's FP8 matmul on Hopper takes only the "TN" form (A transposed, B not; both with the reduction dim
// contiguous), e4m3 x e4m3 or e4m3 x e5m2, fp32 compute, per-tensor dequantization factors through
// CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER (device floats: our scale_invs), leading dims multiples of 16 bytes.
// In row-major terms (K contiguous in both operands):
//   fwd    y[n,out]   = x[n,in]   . w[out,in]^T   A = q(w)    [out, in],  B = q(x)    [n, in]    (no transposes)
//   dgrad  dx[n,in]   = dy[n,out] . w[out,in]     A = q(w)^T  [in, out],  B = q(dy)   [n, out]   (w cast-transposed)
//   wgrad  dw[out,in] = dy^T . x                  A = q(x)^T  [in, n],    B = q(dy)^T [out, n]   (both transposed)
// so every cast that feeds a transposed operand is one fp8_cast_transpose pass (the row-major copy written in the
// same pass where both are needed: dy; and x and w when the forward keeps Fp8Saved, their transposes then kept for the
// backward, which casts only dy). y, dx are written in the activations' dtype (bf16 or fp32); the wgrad writes
// fp32 straight into the main grad (C = D, beta = 1, or 0 to overwrite). The forward uses fast accumulation
// (CUBLASLT_MATMUL_DESC_FAST_ACCUM, Transformer Engine's forward setting); dgrad / wgrad accumulate exactly in fp32.
// The cuBLASLt call and its plan cache: fp8_gemm.h / fp8_gemm.cpp.
#include <cuda_fp8.h>

#include <algorithm>
#include <vector>

#include "mcpp/kernels/cuda/fp8_gemm.h"
#include "mcpp/kernels/cuda/fp8_launch.h"
#include "mcpp/kernels/cuda/gemm_lt.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;
using fp8_detail::Fp8GemmKey;
using fp8_detail::fp8_gemm;
using fp8_detail::try_fp8_gemm;

namespace {

int fmt_of(Fp8Format f) { return f == Fp8Format::E4M3 ? 0 : 1; }
cudaDataType_t fp8_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

// fp8 bytes on the device: a float32 tensor of ceil(n / 4) elements (the Tensor has no byte dtype).
Tensor fp8_bytes(int64_t n) { return Tensor::empty({(n + 3) / 4}, DType::F32, Device::CUDA); }
uint8_t* bytes_of(Tensor& t) { return static_cast<uint8_t*>(t.raw()); }

const float* scale_ptr(const char* op, const char* arg, const Tensor& scale) {
  require_float(op, arg, scale, /*bf16_ok=*/false);
  require_numel(op, arg, scale, 2, "{scale, scale_inv}");
  return scale.data<float>();
}
float* amax_ptr(const char* op, const Tensor* amax) {
  if (!amax || !amax->defined()) return nullptr;
  require_float(op, "amax", *amax, /*bf16_ok=*/false);
  MCPP_CHECK(amax->numel() >= 1, "{}: amax must have at least one element; got {}", op, amax->str());
  return const_cast<float*>(amax->data<float>());
}

void require_multiple_of_16(const char* op, int64_t n, int64_t in, int64_t out) {
  MCPP_CHECK(n % 16 == 0 && in % 16 == 0 && out % 16 == 0,
             "{}: cuBLASLt FP8 GEMMs need every dimension a multiple of 16; got tokens {}, in {}, out {}", op, n, in,
             out);
}

cudaDataType_t out_type(const char* op, const char* arg, const Tensor& t) {
  return gemm_lt::cuda_type(require_float(op, arg, t));
}

// The GEMMs' scale pointers, each 16-byte aligned: every cast copies the scale_inv it quantized with (the second float
// of a {scale, scale_inv} pair, 4 bytes past an aligned base) into a slot of its own, and the GEMM reads the slot.
// cuBLASLt refuses a per-tensor FP8 GEMM whose scale pointer is only 4-byte aligned (status 15, CUDA 13;
// bench/gpu/fp8_gemm_probe.cu shows it).
struct ScaleInvSlots {
  Tensor buf;
  float* slot(int i) {
    const auto base = (reinterpret_cast<uintptr_t>(buf.raw()) + 15) / 16 * 16;
    return reinterpret_cast<float*>(base) + 4 * i;
  }
};
ScaleInvSlots scale_inv_slots(int n) { return {Tensor::empty({4 * n + 4}, DType::F32, Device::CUDA)}; }

// An Fp8Saved operand: nb fp8 bytes, then (16-byte aligned) the scale_inv they were cast with; the GEMMs read both.
int64_t saved_floats(int64_t nb) { return ((nb + 15) / 16 * 16 + 32) / 4; }  // the bytes, the slot, its alignment
float* saved_slot(const Tensor& t, int64_t nb) {
  const auto end = reinterpret_cast<uintptr_t>(t.raw()) + static_cast<uintptr_t>(nb);
  return reinterpret_cast<float*>((end + 15) / 16 * 16);
}
// The saved operand `arg` of nb bytes, checked to be a copy fp8_linear_fwd made for these shapes.
const uint8_t* saved_operand(const char* op, const char* arg, const Tensor& t, int64_t nb) {
  MCPP_CHECK(t.dtype() == DType::F32 && t.device() == Device::CUDA && t.numel() == saved_floats(nb),
             "{}: saved {} must be fp8_linear_fwd's copy of {} fp8 bytes; got {}", op, arg, nb, t.str());
  return static_cast<const uint8_t*>(t.raw());
}

// The backward's transposed fp8 copy of t [rows, cols] and its scale_inv: the forward's saved copy when given,
// else cast here with f's scale into scratch (its scale_inv copied into `slot`).
struct TransposedCast {
  Tensor scratch;
  const uint8_t* bytes = nullptr;
  const float* scale_inv = nullptr;
};
TransposedCast transposed_cast(const char* op, const char* arg, const Tensor* saved, const Tensor& t, int64_t rows,
                               int64_t cols, const Fp8Operand& f, float* slot, cudaStream_t s) {
  if (saved) return {Tensor(), saved_operand(op, arg, *saved, rows * cols), saved_slot(*saved, rows * cols)};
  TransposedCast c{fp8_bytes(rows * cols)};
  launch_fp8_cast_transpose(nullptr, bytes_of(c.scratch), fin_of(op, arg, t), rows, cols,
                            scale_ptr(op, "scale", f.scale), nullptr, fmt_of(f.format), s, slot);
  c.bytes = bytes_of(c.scratch), c.scale_inv = slot;
  return c;
}

// fdy's activation for dy's cast pass: DGelu's gelu' of act_input (dy's shape), DSwiglu's swiglu_bwd of dy and
// act_input (twice dy's columns), or none.
Fp8CastAct dy_act_of(const char* op, const Fp8Operand& fdy, const Tensor& dy) {
  if (fdy.act != Fp8Act::DGelu && fdy.act != Fp8Act::DSwiglu) return {};
  const int64_t want = (fdy.act == Fp8Act::DSwiglu ? 2 : 1) * dy.numel();
  MCPP_CHECK(fdy.act_input.defined() && fdy.act_input.numel() == want && fdy.act_input.dtype() == dy.dtype(),
             "{}: the {} operand's act_input must have {} elements of dy's dtype (dy {}); got {}", op,
             fdy.act == Fp8Act::DGelu ? "DGelu" : "DSwiglu", want, dy.str(),
             fdy.act_input.defined() ? fdy.act_input.str() : std::string("none"));
  return {.act = fdy.act == Fp8Act::DGelu ? 2 : 5, .aux = fin_of(op, "fdy.act_input", fdy.act_input)};
}

// fx's Norm for x's cast-transpose pass (x [n, in] the norm's input): its statistics applied in the cast where the
// norm's forward took its 16-byte path (norm_apply: the bytes it would have written as y); else none (act 0), and the
// caller casts fp8_operand_values' re-run of the norm instead.
Fp8CastAct norm_of(const char* op, const Fp8Operand& fx, const Tensor& x, int64_t n, int64_t in) {
  const Fp8Norm& nm = fx.norm;
  check_fp8_norm(op, nm);
  const float* rstd = row_stat(op, "fx.norm.rstd", nm.rstd, n);
  const float* mean = nm.mean.defined() ? row_stat(op, "fx.norm.mean", nm.mean, n) : nullptr;
  require_numel(op, "fx.norm.weight", nm.weight, in, "in = w.size(1)");
  if (nm.bias.defined()) require_numel(op, "fx.norm.bias", nm.bias, in, "in = w.size(1)");
  const FIn gamma = fin_of(op, "fx.norm.weight", nm.weight);
  const FIn beta = nm.bias.defined() ? fin_of(op, "fx.norm.bias", nm.bias) : FIn{nullptr, kF32};
  if (!norm_fwd_vector_path(in, {x.raw(), gamma.p, beta.p})) return {};
  return {.act = 3, .mean = mean, .rstd = rstd, .gamma = gamma, .beta = beta};
}

}  // namespace

void fp8_quantize(Tensor& out, Tensor* amax_acc, const Tensor& in, const Tensor& scale, Fp8Format format,
                  Stream stream) {
  const char* op = "fp8_quantize";
  require_same_shape(op, "out", out, "in", in);
  launch_fp8_cast(nullptr, fout_of(op, "out", out), fin_of(op, "in", in), in.numel(), scale_ptr(op, "scale", scale),
                  amax_ptr(op, amax_acc), fmt_of(format), stream_of(stream));
}

void fp8_amax(Tensor& amax_acc, const Tensor& in, Stream stream) {
  launch_fp8_amax(amax_ptr("fp8_amax", &amax_acc), fin_of("fp8_amax", "in", in), in.numel(), stream_of(stream));
}

void fp8_scale_update(Tensor& scale, Tensor& amax_history, const Fp8ScalingOptions& opt, Stream stream) {
  const char* op = "fp8_scale_update";
  require_float(op, "amax_history", amax_history, /*bf16_ok=*/false);
  MCPP_CHECK(amax_history.numel() >= 1 && amax_history.numel() <= kFp8MaxHistory,
             "{}: amax_history must have 1 to {} elements; got {}", op, kFp8MaxHistory, amax_history.str());
  launch_fp8_scale_update(const_cast<float*>(scale_ptr(op, "scale", scale)), amax_history.data<float>(),
                          amax_history.numel(), fp8_max(opt.format), opt.margin, opt.most_recent, stream_of(stream));
}

void fp8_scale_update_multi(const std::vector<Fp8ScaleState>& list, Tensor& amax, Stream stream) {
  const char* op = "fp8_scale_update_multi";
  require_float(op, "amax", amax, /*bf16_ok=*/false);
  check_fp8_scale_update_multi(list, amax);
  Fp8ScaleUpdateBatch b{};
  b.amax = amax.data<float>();
  auto launch = [&] {
    launch_fp8_scale_update_multi(b, stream_of(stream));
    b.count = b.max_len = 0;
  };
  for (const Fp8ScaleState& e : list) {
    require_float(op, "amax_history", e.amax_history, /*bf16_ok=*/false);
    const int64_t len = e.amax_history.numel();
    MCPP_CHECK(len <= kFp8MaxHistory, "{}: amax_history must have 1 to {} elements; got {}", op,
               kFp8MaxHistory, e.amax_history.str());
    const int i = b.count++;
    b.scale[i] = const_cast<float*>(scale_ptr(op, "scale", e.scale));
    b.before[i] =
        e.scale_before.defined() ? const_cast<float*>(scale_ptr(op, "scale_before", e.scale_before)) : nullptr;
    b.history[i] = const_cast<float*>(e.amax_history.data<float>());
    b.len[i] = static_cast<int32_t>(len);
    b.slot[i] = static_cast<int32_t>(e.amax_slot);
    b.fp8_max[i] = fp8_max(e.opt.format);
    b.margin[i] = static_cast<int16_t>(e.opt.margin);
    b.most_recent[i] = e.opt.most_recent;
    b.max_len = std::max(b.max_len, static_cast<int>(len));
    if (b.count == Fp8ScaleUpdateBatch::kMax) launch();
  }
  launch();
}

void fp8_linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, const Tensor* bias, const Fp8Operand& fx,
                    const Fp8Operand& fw, Fp8Saved* saved, Stream stream) {
  const char* op = "fp8_linear_fwd";
  const cudaStream_t s = stream_of(stream);
  MCPP_CHECK(w.ndim() == 2, "{}: w must be [out, in]; got {}", op, w.str());
  const int64_t out = w.size(0), in = w.size(1);
  const int64_t x_cols = fx.act == Fp8Act::Swiglu ? 2 * in : in, n = x.numel() / std::max<int64_t>(x_cols, 1);
  MCPP_CHECK(x.size(-1) == x_cols && y.size(-1) == out && y.numel() == n * out,
             "{}: x [.., {}] and y [.., {}] must have matching rows; got x {}, y {}", op, x_cols, out, x.str(),
             y.str());
  require_multiple_of_16(op, n, in, out);
  MCPP_CHECK(fw.act == Fp8Act::None && fx.act != Fp8Act::DGelu && fx.act != Fp8Act::DSwiglu,
             "{}: fx takes None, Gelu, Swiglu or Norm, fw no activation", op);
  Tensor qx = fp8_bytes(n * in), qw = fp8_bytes(out * in);
  // fx.act Gelu / Swiglu / Norm: with saved, applied in x's cast-transpose pass (Norm: where its statistics apply);
  // else written out first
  Fp8CastAct xact;
  if (saved && fx.act == Fp8Act::Gelu) xact.act = 1;
  if (saved && fx.act == Fp8Act::Swiglu) xact.act = 4;
  if (saved && fx.act == Fp8Act::Norm) xact = norm_of(op, fx, x, n, in);
  const bool in_cast = fx.act == Fp8Act::None || xact.act != 0;
  const Tensor xv = in_cast ? x : fp8_operand_values(op, x, fx, stream);
  const FIn xin = fin_of(op, "x", xv), win = fin_of(op, "w", w);
  const float *xs = scale_ptr(op, "fx.scale", fx.scale), *ws = scale_ptr(op, "fw.scale", fw.scale);
  float *xa = amax_ptr(op, &fx.amax), *wa = amax_ptr(op, &fw.amax);
  ScaleInvSlots sinv;
  float *sx = nullptr, *sw = nullptr;
  // saved: q(x) with q(x)^T [in, n] and q(w) with q(w)^T [in, out], each pair in one pass; the scale slots: the copies'
  if (saved) {
    *saved = {.x = fp8_bytes(saved_floats(n * in) * 4), .w = fp8_bytes(saved_floats(out * in) * 4)};
    sx = saved_slot(saved->x, n * in), sw = saved_slot(saved->w, out * in);
    launch_fp8_cast_transpose(bytes_of(qx), bytes_of(saved->x), xin, n, in, xs, xa, fmt_of(fx.format), s, sx, {},
                              xact);
    launch_fp8_cast_transpose(bytes_of(qw), bytes_of(saved->w), win, out, in, ws, wa, fmt_of(fw.format), s, sw);
  } else {
    sinv = scale_inv_slots(2);
    sx = sinv.slot(0), sw = sinv.slot(1);
    launch_fp8_cast(bytes_of(qx), FOut{nullptr, kF32}, xin, n * in, xs, xa, fmt_of(fx.format), s, sx);
    launch_fp8_cast(bytes_of(qw), FOut{nullptr, kF32}, win, out * in, ws, wa, fmt_of(fw.format), s, sw);
  }
  Fp8GemmKey key{out, n, in, fp8_type(fw.format), fp8_type(fx.format), out_type(op, "y", y), true};
  if (bias) {  // in the epilogue (y's dtype); where cuBLASLt has no such FP8 kernel, added after the GEMM
    MCPP_CHECK(bias->dtype() == y.dtype(), "{}: bias must have y's dtype {}; got {}", op, dtype_name(y.dtype()),
               bias->str());
    require_numel(op, "bias", *bias, out, "out = w.size(0)");
    key.tbias = key.td;
    if (try_fp8_gemm(y.raw(), key, bytes_of(qw), sw, bytes_of(qx), sx, 0.0f, s, bias->raw())) return;
    key.tbias = -1;
  }
  fp8_gemm(y.raw(), key, bytes_of(qw), sw, bytes_of(qx), sx, 0.0f, s);
  if (bias) bias_add_inplace(y, *bias, stream);
}

void fp8_linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x, const Tensor& w,
                    const Fp8Operand& fdy, const Fp8Operand& fx, const Fp8Operand& fw, const Fp8Saved* saved,
                    GradWrite grad_write, Stream stream) {
  const char* op = "fp8_linear_bwd";
  const cudaStream_t s = stream_of(stream);
  const bool saved_x = saved && saved->x.defined(), saved_w = saved && saved->w.defined();
  MCPP_CHECK(fw.act == Fp8Act::None && (fdy.act == Fp8Act::None || fdy.act == Fp8Act::DGelu ||
                                        fdy.act == Fp8Act::DSwiglu) &&
                 fx.act != Fp8Act::DGelu && fx.act != Fp8Act::DSwiglu,
             "{}: fdy takes None, DGelu or DSwiglu, fx no gradient activation, fw no activation", op);
  // dy's values [n, out]: dy itself, or its activation's gradient (DSwiglu: dy [n, out / 2], act_input [n, out])
  const Fp8CastAct dy_act = dy_act_of(op, fdy, dy);
  const Tensor& dy_rows = fdy.act == Fp8Act::DSwiglu ? fdy.act_input : dy;  // [n, out]
  int64_t n = 0;
  if (saved_x) {  // x is not read: the rows from dy
    MCPP_CHECK(w.ndim() == 2 && dw_acc.shape() == w.shape(), "{}: w [out, in] and dw_acc like w; got w {}, dw_acc {}",
               op, w.str(), dw_acc.str());
    require_float(op, "dw_acc", dw_acc, /*bf16_ok=*/false);
    n = dy_rows.numel() / std::max<int64_t>(w.size(0), 1);
    MCPP_CHECK(dy_rows.numel() == n * w.size(0), "{}: dy must be [n, {}]; got {}", op, w.size(0), dy_rows.str());
  } else {
    n = linear_bwd_rows(op, dw_acc, dy_rows, x, w);
  }
  const int64_t out = w.size(0), in = w.size(1);
  require_multiple_of_16(op, n, in, out);
  MCPP_CHECK(!(fdy.format == Fp8Format::E5M2 && fw.format == Fp8Format::E5M2) &&
                 !(fdy.format == Fp8Format::E5M2 && fx.format == Fp8Format::E5M2),
             "{}: cuBLASLt has no e5m2 x e5m2 GEMM", op);
  ScaleInvSlots sinv = scale_inv_slots(3);  // dy, and w and x where not saved
  float* sdy = sinv.slot(0);
  // q(dy) [n, out] (dgrad's B) and q(dy)^T [out, n] (wgrad's B) in one pass, recording dy's amax, with the bias
  // gradient's column sums of dy and fdy's DGelu (dy * gelu'(act_input)) or DSwiglu in the same pass
  Tensor qdy = fp8_bytes(n * out), qdyt = fp8_bytes(n * out);
  Fp8Dbias dbias;
  Tensor partial;
  if (db_acc) {
    require_float(op, "db_acc", *db_acc, /*bf16_ok=*/false);
    require_numel(op, "db_acc", *db_acc, out, "out = w.size(0)");
    if (grad_write == GradWrite::Overwrite) MCPP_CUDA_CHECK(cudaMemsetAsync(db_acc->raw(), 0, db_acc->nbytes(), s));
    partial = Tensor::empty({fp8_dbias_parts(n), out}, DType::F32, Device::CUDA);
    dbias = {db_acc->data<float>(), partial.data<float>()};
  }
  launch_fp8_cast_transpose(dx ? bytes_of(qdy) : nullptr, bytes_of(qdyt), fin_of(op, "dy", dy), n, out,
                            scale_ptr(op, "fdy.scale", fdy.scale), amax_ptr(op, &fdy.amax), fmt_of(fdy.format), s,
                            sdy, dbias, dy_act);
  if (dx) {  // dx[n,in] = q(dy)[n,out] . (q(w)^T [in,out])^T
    MCPP_CHECK(dx->numel() == n * in, "{}: dx must have {} elements; got {}", op, n * in, dx->str());
    const TransposedCast wt = transposed_cast(op, "w", saved_w ? &saved->w : nullptr, w, out, in, fw, sinv.slot(1), s);
    const Fp8GemmKey key{in, n, out, fp8_type(fw.format), fp8_type(fdy.format), out_type(op, "dx", *dx), false};
    fp8_gemm(dx->raw(), key, wt.bytes, wt.scale_inv, bytes_of(qdy), sdy, 0.0f, s);
  }
  // dw[out,in] (+)= q(dy)^T [out,n] . (q(x)^T [in,n])^T, fp32 straight into the main grad
  const TransposedCast xt = transposed_cast(op, "x", saved_x ? &saved->x : nullptr,
                                            saved_x ? x : fp8_operand_values(op, x, fx, stream), n, in, fx,
                                            sinv.slot(2), s);
  const bool overwrite = grad_write == GradWrite::Overwrite;
  const Fp8GemmKey key{in, out, n, fp8_type(fx.format), fp8_type(fdy.format), CUDA_R_32F, false};
  fp8_gemm(dw_acc.raw(), key, xt.bytes, xt.scale_inv, bytes_of(qdyt), sdy, overwrite ? 0.0f : 1.0f, s);
}

}  // namespace mcpp::ops::cuda
