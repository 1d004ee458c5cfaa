// CUDA FP8 blockwise scaling (kernels/cuda/fp8_block*.{cpp,cu}; --fp8-recipe blockwise) against the CPU emulation
// (kernels/cpu/fp8_block.cpp, itself checked against a float64 oracle in tests/kernels/fp8_block_test.cpp):
//   - the quantize kernels (1x128 tiles, the wgrad's transposing 128x1 tiles, 128x128 blocks): the fp8 values and
//     the per-block scale_inv bit for bit, fp32 and bf16 inputs, e4m3 and e5m2, blocks spanning 2^-30..2^20 and an
//     all-zero block;
//   - the GEMMs (fwd: 128x128 w x 1x128 x; dgrad: 128x128 w^T x 1x128 dy; wgrad: 1x128 x 1x128 along the tokens, into
//     the fp32 main grad, accumulate and overwrite) against the CPU emulation on the same bf16 inputs, on both paths
//     (kernels/fp8_block_gemm_path.h: cuBLASLt's block-scaled FP8 GEMM where it has one, and the dequantized bf16
//     fallback, forced): the fp8 operands and scales are identical, so only the accumulation differs;
//   - a short bf16 GPT run with blockwise FP8 (e4m3, hybrid; and e4m3 on the forced fallback) against the same run
//     without: the loss within a stated tolerance.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include "cuda/cuda_test_util.h"
#include "mcpp/kernels/fp8_block_gemm_path.h"
#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

using ops::Fp8Block;
using ops::Fp8Format;

// [rows, cols] with one magnitude per 64-row x 96-column region (2^-30 .. 2^20) and an all-zero 128x128 block.
Tensor spread(const Shape& shape, uint64_t seed, DType dt) {
  Tensor t = rnd(shape, seed, DType::F32, -1.0, 1.0);
  const int64_t rows = shape[0], cols = shape[1];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t.data<float>()[r * cols + c] *= std::ldexp(1.0f, static_cast<int>(((r / 64) * 7 + (c / 96) * 5) % 51) - 30);
  for (int64_t r = 128; r < 256 && r < rows; ++r)
    for (int64_t c = 0; c < 128; ++c) t.data<float>()[r * cols + c] = 0.0f;
  return dt == DType::F32 ? t : t.to(dt).to(DType::F32);
}

TEST(CudaFp8Block, QuantizeEqualsTheCpuEmulationBitForBit) {
  MCPP_REQUIRE_CUDA();
  const int64_t rows = 256, cols = 384;
  for (DType dt : {DType::F32, DType::BF16})
    for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2})
      for (Fp8Block block : {Fp8Block::Tile1x128, Fp8Block::Tile128x1, Fp8Block::Block128x128}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " fmt " << static_cast<int>(fmt) << " block "
                                          << static_cast<int>(block));
        const Tensor x = spread({rows, cols}, 51, dt);
        const int64_t br = block == Fp8Block::Tile1x128 ? 1 : 128, bc = block == Fp8Block::Tile128x1 ? 1 : 128;
        const Shape qshape = block == Fp8Block::Tile128x1 ? Shape{cols, rows} : Shape{rows, cols};
        Tensor want = Tensor::empty(qshape), want_s = Tensor::empty({rows / br, cols / bc});
        ops::cpu::fp8_block_quantize(want, want_s, x, block, fmt, {});
        Tensor got = poisoned(qshape, DType::F32), got_s = poisoned({rows / br, cols / bc}, DType::F32);
        ops::fp8_block_quantize(got, got_s, dev(x, dt), block, fmt);
        const Tensor g = host(got), gs = host(got_s);
        for (int64_t i = 0; i < want.numel(); ++i)
          ASSERT_EQ(std::memcmp(&g.data<float>()[i], &want.data<float>()[i], 4), 0)
              << "q[" << i << "] got " << g.data<float>()[i] << " want " << want.data<float>()[i];
        for (int64_t i = 0; i < want_s.numel(); ++i)
          ASSERT_EQ(gs.data<float>()[i], want_s.data<float>()[i]) << "scale_inv[" << i << "]";
      }
}

// One path's GEMMs against the CPU emulation. block_scaled: cuBLASLt's block-scaled kernels add each 128-deep block on
// the FP8 tensor cores (~14-bit partial sums, DeepSeek-V3 3.3.2) and promote it to fp32 with its scales (no fast
// accumulation: ~2^-14 relative); dequantized: the same exact operand values in bf16, fp32 accumulation (only the
// summation order differs from the CPU's). Both then round y / dx to bf16 (2^-9).
void check_gemms(bool dequantized) {
  const int64_t n = 256, in = 384, out = 640;  // in / 128 = 3 (its 2D scales padded to 4), out / 128 = 5
  const Tensor x = rnd({n, in}, 61, DType::BF16, -2.0, 2.0), w = rnd({out, in}, 62, DType::BF16, -0.1, 0.1);
  const Tensor dy = rnd({n, out}, 63, DType::BF16, -1e-3, 1e-3);
  const double fp32_tol = dequantized ? 1e-5 : 1e-3;  // dw (fp32 output): the accumulation only
  for (Fp8Format gfmt : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(gfmt == Fp8Format::E4M3 ? "e4m3 grads" : "hybrid (e5m2 grads)");
    Tensor y_ref = Tensor::empty({n, out});
    ops::cpu::fp8_block_linear_fwd(y_ref, x, w, {});
    Tensor y = poisoned({n, out}, DType::BF16);
    ops::fp8_block_linear_fwd(y, dev(x, DType::BF16), dev(w, DType::BF16));
    EXPECT_REL(host(y), y_ref, 5e-3);  // the bf16 output rounding dominates (the per-tensor dgrad's bound, fp8_test)

    Tensor dx_ref = Tensor::empty({n, in}), dw_ref = rnd({out, in}, 64, DType::F32, -1e-3, 1e-3);
    Tensor db_ref = Tensor::zeros({out});
    Tensor dw = dev(dw_ref), db = dev(db_ref), dx = poisoned({n, in}, DType::BF16);
    ops::cpu::fp8_block_linear_bwd(&dx_ref, dw_ref, &db_ref, dy, x, w, gfmt, ops::GradWrite::Accumulate, {});
    ops::fp8_block_linear_bwd(&dx, dw, &db, dev(dy, DType::BF16), dev(x, DType::BF16), dev(w, DType::BF16), gfmt,
                              ops::GradWrite::Accumulate);
    EXPECT_REL(host(dx), dx_ref, 5e-3);      // as y
    EXPECT_REL(host(dw), dw_ref, fp32_tol);  // fp32 output (and the accumulated dw)
    EXPECT_REL(host(db), db_ref, 1e-5);      // column sums of the bf16 dy, fp32

    Tensor dw_over = dev(rnd({out, in}, 65)), dw_over_ref = Tensor::empty({out, in});
    ops::cpu::fp8_block_linear_bwd(nullptr, dw_over_ref, nullptr, dy, x, w, gfmt, ops::GradWrite::Overwrite, {});
    ops::fp8_block_linear_bwd(nullptr, dw_over, nullptr, dev(dy, DType::BF16), dev(x, DType::BF16),
                              dev(w, DType::BF16), gfmt, ops::GradWrite::Overwrite);
    EXPECT_REL(host(dw_over), dw_over_ref, fp32_tol);  // as dw
  }
}

// The path cuBLASLt gives (block-scaled on Hopper with cuBLAS 12.9+; printed), then the dequantized fallback forced.
TEST(CudaFp8Block, GemmsMatchTheCpuEmulation) {
  MCPP_REQUIRE_CUDA();
  const ops::cuda::Fp8BlockGemmCounts before = ops::cuda::fp8_block_gemm_counts();
  check_gemms(/*dequantized=*/false);
  const ops::cuda::Fp8BlockGemmCounts mid = ops::cuda::fp8_block_gemm_counts();
  const int64_t native = mid.block_scaled - before.block_scaled, fallback = mid.dequantized - before.dequantized;
  std::printf("[ path ] cuBLASLt block-scaled GEMMs %lld, dequantized fallback %lld\n", static_cast<long long>(native),
              static_cast<long long>(fallback));
  EXPECT_EQ(native + fallback, 2 * 4);  // per format: fwd, dgrad, wgrad (accumulate), wgrad (overwrite)
  ops::cuda::set_fp8_block_gemm_dequantize(true);
  check_gemms(/*dequantized=*/true);
  ops::cuda::set_fp8_block_gemm_dequantize(false);
  const ops::cuda::Fp8BlockGemmCounts after = ops::cuda::fp8_block_gemm_counts();
  EXPECT_EQ(after.block_scaled, mid.block_scaled) << "forced: no block-scaled GEMM";
  EXPECT_EQ(after.dequantized - mid.dequantized, 2 * 4);
}

// gpu_train_config's GPT (d128, 2 heads of 64, FFN 512, 64 tokens x micro-batch 4: every GEMM dim a multiple of 128)
// in bf16, with --fp8-recipe blockwise (e4m3: DeepSeek-V3's; hybrid) against the bf16 run: within 3% at every step of
// 8, as the per-tensor recipes (tests/cuda/fp8_test.cpp); the CPU emulation is within 1% at 30 steps
// (tests/training/fp8_training_test.cpp).
TEST(CudaFp8BlockTraining, LossFollowsTheBf16Run) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_fp8_block_gpu_" + std::to_string(::getpid()));
  const std::string data = training_test::make_corpus(dir);
  Config base = training_test::gpu_train_config(data);
  base.training.bf16 = true;
  base.validate();
  const TrainSummary ref = Trainer(base, 99, training_test::single()).train();
  for (const auto& [format, dequantized] : {std::pair{"e4m3", false}, std::pair{"hybrid", false},
                                            std::pair{"e4m3", true}}) {  // true: the bf16 fallback GEMMs, forced
    SCOPED_TRACE(std::string(format) + (dequantized ? " dequantized" : ""));
    Config c = base;
    c.model.fp8_format = format;
    c.model.fp8_recipe = "blockwise";
    c.validate();
    ops::cuda::set_fp8_block_gemm_dequantize(dequantized);
    const TrainSummary s = Trainer(c, 99, training_test::single()).train();
    ops::cuda::set_fp8_block_gemm_dequantize(false);
    ASSERT_EQ(s.losses.size(), ref.losses.size());
    for (size_t i = 0; i < s.losses.size(); ++i)
      EXPECT_NEAR(s.losses[i], ref.losses[i], 0.03 * ref.losses[i]) << "iteration " << i + 1;
    EXPECT_NE(s.losses.back(), ref.losses.back()) << "the FP8 GEMMs are in the path";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mcpp::cuda_test
