// CUDA FP8 blockwise ops (ops.inc fp8_block_*; --fp8-recipe blockwise): argument checks, fp8 byte and scale scratch,
// the quantize kernels (fp8_block_kernels.cu) and cuBLASLt's block-scaled FP8 GEMMs (fp8_gemm.h: TN only on Hopper,
// Vec128 x Blk128x128 or Vec128 x Vec128, no fast accumulation). In row-major terms, K contiguous in both operands:
//   fwd    y[n,out]   = x . w^T     A = q(w)    [out, in]  128x128   B = q(x)    [n, in]    1x128 along in
//   dgrad  dx[n,in]   = dy . w      A = q(w)^T  [in, out]  128x128   B = q(dy)   [n, out]   1x128 along out
//   wgrad  dw[out,in] = dy^T . x    A = q'(x)^T [in, n]    1x128     B = q'(dy)^T [out, n]  1x128 (along n)
// The weight's two copies share their blocks (one kernel writes both, the scales transposed); the wgrad's operands are
// quantized afresh along n (Transformer Engine's columnwise quantization) by the transposing 128x1 kernel. Scales
// are written straight in the GEMM-ready layouts (fp8_gemm.h; every dim here is a multiple of 128, so only the 2D
// scales' rows are padded, to a multiple of 4). y and dx are written in the activations' dtype; the wgrad writes
// fp32 into the main grad (beta 1, or 0 to overwrite).
// Where cuBLASLt has no block-scaled algorithm for a GEMM (an older cuBLAS, another GPU), or when a test forces it,
// the GEMM runs dequantized: both operands decoded and scaled into bf16 copies (exact) and one bf16 GEMM with fp32
// accumulation (fp8_block_gemm_path.h; fp8_block_gemm_counts() says which ran).
#include <algorithm>
#include <atomic>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/cuda/fp8_gemm.h"
#include "mcpp/kernels/cuda/fp8_launch.h"
#include "mcpp/kernels/cuda/gemm_lt.h"
#include "mcpp/kernels/fp8_block_gemm_path.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;
using fp8_detail::Fp8GemmKey;
using fp8_detail::Fp8Scaling;
using fp8_detail::pad4;

namespace {
constexpr int64_t B = kFp8BlockLen;

int fmt_of(Fp8Format f) { return f == Fp8Format::E4M3 ? 0 : 1; }
cudaDataType_t fp8_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
Tensor fp8_bytes(int64_t n) { return Tensor::empty({(n + 3) / 4}, DType::F32, Device::CUDA); }  // n bytes
uint8_t* bytes_of(Tensor& t) { return static_cast<uint8_t*>(t.raw()); }
float* floats_of(Tensor& t) { return t.data<float>(); }

void require_blocks(const char* op, int64_t n, int64_t in, int64_t out) {
  MCPP_CHECK(n % B == 0 && in % B == 0 && out % B == 0,
             "{}: FP8 blockwise scaling needs every GEMM dimension a multiple of 128; got tokens {}, in {}, out {}", op,
             n, in, out);
}

// An operand [rows][k] quantized in 1x128 tiles along k: its bytes and its Vec128 scales [k/128][rows].
struct Vec128Operand {
  Tensor q, sinv;
};
Vec128Operand quantize_rows(const FIn& in, int64_t rows, int64_t k, Fp8Format f, cudaStream_t s) {
  Vec128Operand o{fp8_bytes(rows * k), Tensor::empty({k / B, rows}, DType::F32, Device::CUDA)};
  launch_fp8_block_quantize_1x128(bytes_of(o.q), {floats_of(o.sinv), 1, rows}, in, rows, k, fmt_of(f), s);
  return o;
}
// in [n][cols] quantized in 128x1 tiles (along n), transposed: bytes [cols][n] and Vec128 scales [n/128][cols].
Vec128Operand quantize_cols_t(const FIn& in, int64_t n, int64_t cols, Fp8Format f, cudaStream_t s) {
  Vec128Operand o{fp8_bytes(n * cols), Tensor::empty({n / B, cols}, DType::F32, Device::CUDA)};
  launch_fp8_block_quantize_128x1_t(bytes_of(o.q), {floats_of(o.sinv), cols, 1}, in, n, cols, fmt_of(f), s);
  return o;
}
std::atomic<int64_t> g_block_scaled{0}, g_dequantized{0};
std::atomic<bool> g_force_dequantize{false};

// One operand of a blockwise GEMM: fp8 bytes [rows][k] (k contiguous) and its scales in cuBLASLt's layout (Vec128
// [k/128][rows], or Blk128x128 [rows/128][pad4(k/128)]).
struct BlockOperand {
  const Tensor& q;
  const Tensor& sinv;
  Fp8Scaling scaling;
  int64_t rows;
  Fp8Format format;
};

// The operand's values decode(q) * scale_inv as bf16 [rows, k] (exact: an fp8 value times a power of 2).
Tensor dequantized(const BlockOperand& o, int64_t k, cudaStream_t s) {
  Tensor out = Tensor::empty({o.rows, k}, DType::BF16, Device::CUDA);
  const float* sinv = o.sinv.data<float>();
  const BlockScaleIn si = o.scaling == Fp8Scaling::Blk128x128 ? BlockScaleIn{sinv, pad4(k / B), 1, B, B}
                                                               : BlockScaleIn{sinv, 1, o.rows, 1, B};
  launch_fp8_block_dequantize(fout_of("fp8_block_gemm", "dequantized", out), static_cast<const uint8_t*>(o.q.raw()),
                              si, o.rows, k, fmt_of(o.format), s);
  return out;
}

// d [n, m] (row-major, its own dtype) = b [n, k] . a [m, k]^T (+ beta d): cuBLASLt's block-scaled FP8 GEMM, or the
// dequantized fallback (the file's header).
void block_gemm(const char* op, Tensor& d, const BlockOperand& a, const BlockOperand& b, int64_t k, float beta,
                Stream stream) {
  const cudaStream_t s = stream_of(stream);
  const Fp8GemmKey key{a.rows, b.rows, k, fp8_type(a.format), fp8_type(b.format),
                       gemm_lt::cuda_type(require_float(op, "out", d)), false, a.scaling, b.scaling};
  if (!g_force_dequantize.load() &&
      fp8_detail::try_fp8_gemm(d.raw(), key, static_cast<const uint8_t*>(a.q.raw()), a.sinv.data<float>(),
                               static_cast<const uint8_t*>(b.q.raw()), b.sinv.data<float>(), beta, s)) {
    ++g_block_scaled;
    return;
  }
  ++g_dequantized;
  const Tensor da = dequantized(a, k, s), db = dequantized(b, k, s);  // [m, k], [n, k] bf16
  Tensor d2 = d.view({b.rows, a.rows});                                // [n, m]
  ops::cuda::gemm(d2, db, da, GemmOptions{.trans_a = false, .trans_b = true, .alpha = 1.0f, .beta = beta}, stream);
}
}  // namespace

Fp8BlockGemmCounts fp8_block_gemm_counts() { return {g_block_scaled.load(), g_dequantized.load()}; }
void set_fp8_block_gemm_dequantize(bool on) { g_force_dequantize = on; }
bool fp8_block_gemm_dequantize() { return g_force_dequantize.load(); }

void fp8_block_quantize(Tensor& out, Tensor& scale_inv, const Tensor& in, Fp8Block block, Fp8Format format,
                        Stream stream) {
  const char* op = "fp8_block_quantize";
  const cudaStream_t s = stream_of(stream);
  require_float(op, "scale_inv", scale_inv, /*bf16_ok=*/false);
  MCPP_CHECK(in.ndim() == 2 && in.size(0) % B == 0 && in.size(1) % B == 0,
             "{}: in must be [rows, cols], both multiples of 128; got {}", op, in.str());
  require_numel(op, "out", out, in.numel(), "in's");
  const int64_t rows = in.size(0), cols = in.size(1);
  Tensor q = fp8_bytes(rows * cols);
  if (block == Fp8Block::Tile1x128) {  // the GEMM path's kernel, its scales written compact [rows][cols/128]
    require_numel(op, "scale_inv", scale_inv, rows * (cols / B), "rows * cols / 128");
    launch_fp8_block_quantize_1x128(bytes_of(q), {floats_of(scale_inv), cols / B, 1}, fin_of(op, "in", in), rows, cols,
                                    fmt_of(format), s);
  } else if (block == Fp8Block::Tile128x1) {  // the wgrad's transposing kernel: q [cols][rows], scales [rows/128][cols]
    require_numel(op, "scale_inv", scale_inv, rows / B * cols, "rows / 128 * cols");
    launch_fp8_block_quantize_128x1_t(bytes_of(q), {floats_of(scale_inv), cols, 1}, fin_of(op, "in", in), rows, cols,
                                      fmt_of(format), s);
  } else {
    require_numel(op, "scale_inv", scale_inv, rows / B * (cols / B), "rows / 128 * cols / 128");
    launch_fp8_block_quantize_128x128(bytes_of(q), nullptr, {floats_of(scale_inv), cols / B, 1}, {nullptr, 0, 0},
                                      fin_of(op, "in", in), rows, cols, fmt_of(format), s);
  }
  launch_fp8_decode(fout_of(op, "out", out), bytes_of(q), rows * cols, fmt_of(format), s);
}

void fp8_block_linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, Stream stream) {
  const char* op = "fp8_block_linear_fwd";
  const cudaStream_t s = stream_of(stream);
  MCPP_CHECK(w.ndim() == 2, "{}: w must be [out, in]; got {}", op, w.str());
  const int64_t out = w.size(0), in = w.size(1), n = x.numel() / std::max<int64_t>(in, 1);
  MCPP_CHECK(x.size(-1) == in && y.size(-1) == out && y.numel() == n * out,
             "{}: x [.., {}] and y [.., {}] must have matching rows; got x {}, y {}", op, in, out, x.str(), y.str());
  require_blocks(op, n, in, out);
  const Vec128Operand qx = quantize_rows(fin_of(op, "x", x), n, in, Fp8Format::E4M3, s);
  Tensor qw = fp8_bytes(out * in), sw = Tensor::empty({out / B, pad4(in / B)}, DType::F32, Device::CUDA);
  MCPP_CUDA_CHECK(cudaMemsetAsync(sw.raw(), 0, sw.nbytes(), s));  // the padding columns: zeros, as TE's
  launch_fp8_block_quantize_128x128(bytes_of(qw), nullptr, {floats_of(sw), pad4(in / B), 1}, {nullptr, 0, 0},
                                    fin_of(op, "w", w), out, in, 0, s);
  block_gemm(op, y, {qw, sw, Fp8Scaling::Blk128x128, out, Fp8Format::E4M3},
             {qx.q, qx.sinv, Fp8Scaling::Vec128, n, Fp8Format::E4M3}, in, 0.0f, stream);
}

void fp8_block_linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x,
                          const Tensor& w, Fp8Format dy_format, GradWrite grad_write, Stream stream) {
  const char* op = "fp8_block_linear_bwd";
  const cudaStream_t s = stream_of(stream);
  const int64_t n = linear_bwd_rows(op, dw_acc, dy, x, w), out = w.size(0), in = w.size(1);
  require_blocks(op, n, in, out);
  const FIn fdy = fin_of(op, "dy", dy);
  if (dx) {  // dx[n,in] = q(dy)[n,out] . (q(w)^T [in,out])^T
    MCPP_CHECK(dx->numel() == n * in, "{}: dx must have {} elements; got {}", op, n * in, dx->str());
    const Vec128Operand qdy = quantize_rows(fdy, n, out, dy_format, s);
    Tensor qwt = fp8_bytes(out * in), swt = Tensor::empty({in / B, pad4(out / B)}, DType::F32, Device::CUDA);
    MCPP_CUDA_CHECK(cudaMemsetAsync(swt.raw(), 0, swt.nbytes(), s));
    Tensor sw_unused = Tensor::empty({out / B, in / B}, DType::F32, Device::CUDA);  // the kernel writes both layouts
    launch_fp8_block_quantize_128x128(nullptr, bytes_of(qwt), {floats_of(sw_unused), in / B, 1},
                                      {floats_of(swt), pad4(out / B), 1}, fin_of(op, "w", w), out, in, 0, s);
    block_gemm(op, *dx, {qwt, swt, Fp8Scaling::Blk128x128, in, Fp8Format::E4M3},
               {qdy.q, qdy.sinv, Fp8Scaling::Vec128, n, dy_format}, out, 0.0f, stream);
  }
  // dw[out,in] (+)= q'(dy)^T [out,n] . (q'(x)^T [in,n])^T, fp32 straight into the main grad
  const Vec128Operand qxt = quantize_cols_t(fin_of(op, "x", x), n, in, Fp8Format::E4M3, s);
  const Vec128Operand qdyt = quantize_cols_t(fdy, n, out, dy_format, s);
  const bool overwrite = grad_write == GradWrite::Overwrite;
  block_gemm(op, dw_acc, {qxt.q, qxt.sinv, Fp8Scaling::Vec128, in, Fp8Format::E4M3},
             {qdyt.q, qdyt.sinv, Fp8Scaling::Vec128, out, dy_format}, n, overwrite ? 0.0f : 1.0f, stream);
  if (db_acc) {
    require_float(op, "db_acc", *db_acc, /*bf16_ok=*/false);
    require_numel(op, "db_acc", *db_acc, out, "out = w.size(0)");
    if (overwrite) MCPP_CUDA_CHECK(cudaMemsetAsync(db_acc->raw(), 0, db_acc->nbytes(), s));
    Tensor partial = Tensor::empty({column_sum_parts(n), out}, DType::F32, Device::CUDA);
    launch_column_sum_acc(db_acc->data<float>(), fdy, n, out, partial.data<float>(), s);
  }
}

}  // namespace mcpp::ops::cuda
