// CPU FP8 blockwise-scaling emulation (ops.h Fp8Block; --fp8-recipe blockwise), the reference and oracle of the CUDA
// block-scaled path (kernels/cuda/fp8_block*.{cpp,cu}):
//   fp8_block_scale:      Transformer Engine's compute_scale_from_amax with power-of-2 scales (ops.h);
//   fp8_block_quantize:   per 1x128 tile / 128x128 block: amax, s, q = fp8_round(x * s); scale_inv = 1 / s, compact;
//   fp8_block_linear_fwd / _bwd: every operand quantized and dequantized (q * scale_inv: exact, a power of 2) into a
//                         float32 copy, then fp32 GEMMs (OpenBLAS). The wgrad quantizes dy and x afresh in 128x1 tiles
//                         (along n). Mathematically the GPU's per-block sum sum_kb (sa sb) sum_k qa qb; the rounding
//                         of the fp32 sums differs.
// Everything float32; Stream ignored.
#include <cblas.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops {

float fp8_block_scale(float amax, Fp8Format f) {
  if (std::isinf(amax) || std::isnan(amax) || amax == 0.0f) return 1.0f;
  float s = fp8_max(f) / amax;  // IEEE division, as __fdiv_rn
  if (std::isinf(s)) s = FLT_MAX;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(s) & 0xFF800000u);  // the mantissa cleared: a power of 2
}

namespace cpu {
using detail::require_cpu_f32;

namespace {
constexpr int64_t B = kFp8BlockLen;

// q (the fp8 values, float32) and scale_inv of x [rows, cols] in blocks of br x bc elements; scale_inv
// [rows / br, cols / bc] row-major. deq: q * scale_inv instead of q.
void quantize_blocks(float* q, float* scale_inv, const float* x, int64_t rows, int64_t cols, int64_t br, int64_t bc,
                     Fp8Format f, bool deq) {
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      float amax = 0.0f;
      for (int64_t r = r0; r < r0 + br; ++r)
        for (int64_t c = c0; c < c0 + bc; ++c) amax = std::fmax(amax, std::fabs(x[r * cols + c]));  // a NaN never wins
      const float s = fp8_block_scale(amax, f), inv = 1.0f / s;
      scale_inv[(r0 / br) * (cols / bc) + c0 / bc] = inv;
      for (int64_t r = r0; r < r0 + br; ++r)
        for (int64_t c = c0; c < c0 + bc; ++c) {
          const float v = fp8_round(x[r * cols + c] * s, f);
          q[r * cols + c] = deq ? v * inv : v;
        }
    }
}

// The dequantized copy of t [rows, cols] in br x bc blocks.
Tensor dequantized(const char* op, const Tensor& t, int64_t rows, int64_t cols, int64_t br, int64_t bc, Fp8Format f) {
  require_cpu_f32(op, "operand", t);
  Tensor out = Tensor::empty({rows, cols});
  std::vector<float> inv(static_cast<size_t>(rows / br * (cols / bc)));
  quantize_blocks(out.data<float>(), inv.data(), t.data<float>(), rows, cols, br, bc, f, true);
  return out;
}

void require_blocks(const char* op, int64_t n, int64_t in, int64_t out) {
  MCPP_CHECK(n % B == 0 && in % B == 0 && out % B == 0,
             "{}: FP8 blockwise scaling needs every GEMM dimension a multiple of 128; got tokens {}, in {}, out {}", op,
             n, in, out);
}

// c[m,n] = op(a) op(b) (+ c when accumulate) over row-major float32 (cblas).
void sgemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
           bool accumulate) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(ta ? m : k), b,
              static_cast<blasint>(tb ? k : n), accumulate ? 1.0f : 0.0f, c, static_cast<blasint>(n));
}
}  // namespace

void fp8_block_quantize(Tensor& out, Tensor& scale_inv, const Tensor& in, Fp8Block block, Fp8Format format, Stream) {
  const char* op = "fp8_block_quantize";
  require_cpu_f32(op, "in", in);
  require_cpu_f32(op, "out", out);
  require_cpu_f32(op, "scale_inv", scale_inv);
  MCPP_CHECK(in.ndim() == 2 && in.size(0) % B == 0 && in.size(1) % B == 0,
             "{}: in must be [rows, cols], both multiples of 128; got {}", op, in.str());
  MCPP_CHECK(out.numel() == in.numel(), "{}: out must have {} elements; got {}", op, in.numel(), out.str());
  const int64_t rows = in.size(0), cols = in.size(1);
  const int64_t br = block == Fp8Block::Tile1x128 ? 1 : B, bc = block == Fp8Block::Tile128x1 ? 1 : B;
  MCPP_CHECK(scale_inv.numel() == rows / br * (cols / bc), "{}: scale_inv must have {} elements; got {}", op,
             rows / br * (cols / bc), scale_inv.str());
  if (block != Fp8Block::Tile128x1) {
    quantize_blocks(out.data<float>(), scale_inv.data<float>(), in.data<float>(), rows, cols, br, bc, format, false);
    return;
  }
  Tensor q = Tensor::empty({rows, cols});  // then transposed into out [cols, rows]
  quantize_blocks(q.data<float>(), scale_inv.data<float>(), in.data<float>(), rows, cols, br, bc, format, false);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.data<float>()[c * rows + r] = q.data<float>()[r * cols + c];
}

void fp8_block_linear_fwd(Tensor& y, const Tensor& x, const Tensor& w, Stream) {
  const char* op = "fp8_block_linear_fwd";
  require_cpu_f32(op, "y", y);
  MCPP_CHECK(w.ndim() == 2, "{}: w must be [out, in]; got {}", op, w.str());
  const int64_t out = w.size(0), in = w.size(1), n = x.numel() / in;
  MCPP_CHECK(x.size(-1) == in && y.size(-1) == out && y.numel() == n * out,
             "{}: x [.., {}] and y [.., {}] must have matching rows; got x {}, y {}", op, in, out, x.str(), y.str());
  require_blocks(op, n, in, out);
  const Tensor dx = dequantized(op, x, n, in, 1, B, Fp8Format::E4M3);       // 1x128 tiles along in
  const Tensor dw = dequantized(op, w, out, in, B, B, Fp8Format::E4M3);     // 128x128 blocks
  sgemm(y.data<float>(), dx.data<float>(), dw.data<float>(), n, out, in, false, true, false);
}

void fp8_block_linear_bwd(Tensor* dx, Tensor& dw_acc, Tensor* db_acc, const Tensor& dy, const Tensor& x,
                          const Tensor& w, Fp8Format dy_format, GradWrite grad_write, Stream) {
  const char* op = "fp8_block_linear_bwd";
  const int64_t n = detail::linear_bwd_rows(op, dw_acc, dy, x, w), out = w.size(0), in = w.size(1);
  require_blocks(op, n, in, out);
  if (dx) {  // dx[n,in] = deq(dy)[n,out] . deq(w)[out,in]: dy in 1x128 tiles along out
    require_cpu_f32(op, "dx", *dx);
    MCPP_CHECK(dx->numel() == n * in, "{}: dx must have {} elements; got {}", op, n * in, dx->str());
    const Tensor qdy = dequantized(op, dy, n, out, 1, B, dy_format);
    const Tensor qw = dequantized(op, w, out, in, B, B, Fp8Format::E4M3);
    sgemm(dx->data<float>(), qdy.data<float>(), qw.data<float>(), n, in, out, false, false, false);
  }
  // dw[out,in] (+)= deq'(dy)^T . deq'(x): both in 128x1 tiles along n; the product added once, as cuBLASLt's beta = 1
  const Tensor qdy = dequantized(op, dy, n, out, B, 1, dy_format);
  const Tensor qx = dequantized(op, x, n, in, B, 1, Fp8Format::E4M3);
  Tensor prod = Tensor::empty({out, in});
  sgemm(prod.data<float>(), qdy.data<float>(), qx.data<float>(), out, in, n, true, false, false);
  // alpha 1: the dequantized operands carry their scales
  detail::add_linear_grads(op, dw_acc, prod, 1.0f, db_acc, dy.view({n, out}), grad_write == GradWrite::Overwrite);
}

}  // namespace cpu
}  // namespace mcpp::ops
