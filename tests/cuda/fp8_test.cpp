// CUDA FP8 (kernels/cuda/fp8*.{cpp,cu}) against the CPU emulation (kernels/cpu/fp8.cpp), and FP8 GPT training:
//   - the cast (fp8_quantize) and amax: bit for bit, fp32 and bf16 inputs, scales that saturate and that reach the
//     subnormals of both formats, the 8-wide and the scalar kernels;
//   - the delayed-scaling update, one tensor and many in one launch: bit for bit;
//   - the cuBLASLt FP8 GEMMs (forward with fast accumulation, dgrad, wgrad into the fp32 main grad) against the CPU
//     emulation on the same bf16 inputs and scales: the fp8 operands are identical, so only the accumulation
//     (order; the forward's fast accumulation) and the output rounding differ;
//   - a short bf16 GPT run with FP8 against the same run without: the loss within a stated tolerance; a resume
//     (--deterministic-mode) continues bit for bit with the FP8 state restored.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "kernels/norm_forward.h"
#include "mcpp/kernels/gemm_autotune.h"
#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

using ops::Fp8Format;

Tensor scale_tensor(float s) {
  Tensor t = Tensor::empty({2});
  t.data<float>()[0] = s;
  t.data<float>()[1] = 1.0f / s;
  return t;
}

TEST(CudaFp8, CastAndAmaxEqualTheCpuEmulationBitForBit) {
  MCPP_REQUIRE_CUDA();
  // 1000 x 37: the 8-wide kernels (37,000 elements, a multiple of 8); 999 x 37: the scalar ones
  for (int64_t rows : {1000, 999})
    for (DType dt : {DType::F32, DType::BF16})
      for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2})
        for (float s : {1.0f, 300.0f, 1e-4f, 3.7e4f}) {  // 300 / 3.7e4: saturation; 1e-4: subnormals and zeros
          SCOPED_TRACE(::testing::Message() << rows << " rows, " << dtype_name(dt) << " fmt " << static_cast<int>(fmt)
                                            << " scale " << s);
          Tensor x = rnd({rows, 37}, 21, dt, -4.0, 4.0);  // odd sizes: partial blocks
          x.data<float>()[7] = -0.0f;
          Tensor want = Tensor::empty(x.shape()), want_amax = Tensor::zeros({1});
          ops::cpu::fp8_quantize(want, &want_amax, x, scale_tensor(s), fmt, {});
          Tensor got = poisoned(x.shape(), dt), amax = dev(Tensor::zeros({1}));
          ops::fp8_quantize(got, &amax, dev(x, dt), dev(scale_tensor(s)), fmt);
          const Tensor g = host(got);
          for (int64_t i = 0; i < x.numel(); ++i)
            ASSERT_EQ(std::memcmp(&g.data<float>()[i], &want.data<float>()[i], 4), 0)
                << "element " << i << ": x " << x.data<float>()[i] << " got " << g.data<float>()[i] << " want "
                << want.data<float>()[i];
          EXPECT_EQ(host(amax).data<float>()[0], want_amax.data<float>()[0]);
          Tensor amax2 = dev(Tensor::zeros({1}));
          ops::fp8_amax(amax2, dev(x, dt));
          EXPECT_EQ(host(amax2).data<float>()[0], want_amax.data<float>()[0]);
        }
}

TEST(CudaFp8, ScaleUpdateEqualsTheCpuBitForBit) {
  MCPP_REQUIRE_CUDA();
  for (bool most_recent : {false, true})
    for (int64_t len : {1, 5, 1024}) {
      Tensor hist = rnd({len}, 31, DType::F32, 0.0, 3.0), scale = scale_tensor(0.75f);
      Tensor dhist = dev(hist), dscale = dev(scale);
      for (int step = 0; step < 3; ++step) {
        const ops::Fp8ScalingOptions opt{.format = Fp8Format::E5M2, .margin = step, .most_recent = most_recent};
        ops::cpu::fp8_scale_update(scale, hist, opt, {});
        ops::fp8_scale_update(dscale, dhist, opt);
        hist.data<float>()[0] = 0.5f * static_cast<float>(step + 1);  // the next step's record
        Tensor h0 = dev(hist.narrow0(0, 1));
        Tensor slot = dhist.narrow0(0, 1);
        slot.copy_from(h0);
      }
      const Tensor gh = host(dhist), gs = host(dscale);
      for (int64_t i = 0; i < len; ++i) ASSERT_EQ(gh.data<float>()[i], hist.data<float>()[i]) << i;
      EXPECT_EQ(gs.data<float>()[0], scale.data<float>()[0]);
      EXPECT_EQ(gs.data<float>()[1], scale.data<float>()[1]);
    }
}

// The fused update of many tensors (a block each, 64 a launch: 200 entries take four launches) bit for bit the CPU's,
// histories up to the longest (8192: 32 KiB of shared memory), NaN and zero amaxes, the scales before copied out
// where asked, every slot zeroed.
TEST(CudaFp8, ScaleUpdateMultiEqualsTheCpuBitForBit) {
  MCPP_REQUIRE_CUDA();
  const int64_t k = 200;
  Tensor amax = rnd({k}, 41, DType::F32, 0.0, 400.0);
  amax.data<float>()[0] = 0.0f;
  amax.data<float>()[9] = NAN;
  Tensor damax = dev(amax);
  std::vector<ops::Fp8ScaleState> cpu, gpu;
  const int64_t lens[] = {1, 3, 1024, 8192};
  for (int64_t e = 0; e < k; ++e) {
    const Tensor hist = rnd({lens[e % 4]}, 200 + static_cast<uint64_t>(e), DType::F32, 0.0, 300.0);
    const ops::Fp8ScalingOptions opt{.format = e % 3 ? Fp8Format::E4M3 : Fp8Format::E5M2,
                                     .margin = static_cast<int>(e % 2),
                                     .most_recent = e % 5 == 0};
    const int64_t slot = (e * 7 + 3) % k;
    const Tensor before = e % 3 == 1 ? Tensor::zeros({2}) : Tensor();
    cpu.push_back({.scale = scale_tensor(0.75f + static_cast<float>(e)), .amax_history = hist, .amax_slot = slot,
                   .opt = opt, .scale_before = before});
    gpu.push_back({.scale = dev(cpu.back().scale), .amax_history = dev(hist), .amax_slot = slot, .opt = opt,
                   .scale_before = before.defined() ? dev(before) : Tensor()});
  }
  ops::cpu::fp8_scale_update_multi(cpu, amax, {});
  ops::fp8_scale_update_multi(gpu, damax);
  for (int64_t e = 0; e < k; ++e) {
    SCOPED_TRACE(e);
    const Tensor gh = host(gpu[e].amax_history), gs = host(gpu[e].scale);
    ASSERT_EQ(0, std::memcmp(gh.raw(), cpu[e].amax_history.raw(), gh.nbytes()));
    ASSERT_EQ(0, std::memcmp(gs.raw(), cpu[e].scale.raw(), 8));
    if (e % 3 == 1) {  // the scale before (0.75 + e, exact), copied out
      const Tensor gb = host(gpu[e].scale_before);
      ASSERT_EQ(0, std::memcmp(gb.raw(), cpu[e].scale_before.raw(), 8));
      EXPECT_EQ(gb.data<float>()[0], 0.75f + static_cast<float>(e));
    }
  }
  const Tensor ga = host(damax);
  for (int64_t i = 0; i < k; ++i) EXPECT_EQ(ga.data<float>()[i], 0.0f) << i;
}

TEST(CudaFp8, GemmsMatchTheCpuEmulation) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 256, in = 192, out = 160;  // multiples of 16 (cuBLASLt FP8)
  Tensor x = rnd({n, in}, 41, DType::BF16, -2.0, 2.0), w = rnd({out, in}, 42, DType::BF16, -0.1, 0.1);
  Tensor dy = rnd({n, out}, 43, DType::BF16, -1e-3, 1e-3);
  const float sx = 448.0f / 2.0f, sw = 448.0f / 0.1f, sdy = 57344.0f / 1e-3f;
  for (Fp8Format gfmt : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(gfmt == Fp8Format::E4M3 ? "e4m3 grads" : "hybrid (e5m2 grads)");
    const float sg = gfmt == Fp8Format::E4M3 ? 448.0f / 1e-3f : sdy;
    const ops::Fp8Operand cx{.scale = scale_tensor(sx), .amax = Tensor::zeros({1})};
    const ops::Fp8Operand cw{.scale = scale_tensor(sw), .amax = Tensor::zeros({1})};
    const ops::Fp8Operand cdy{.scale = scale_tensor(sg), .amax = Tensor::zeros({1}), .format = gfmt};
    const ops::Fp8Operand gx{.scale = dev(cx.scale), .amax = dev(Tensor::zeros({1}))};
    const ops::Fp8Operand gw{.scale = dev(cw.scale), .amax = dev(Tensor::zeros({1}))};
    const ops::Fp8Operand gdy{.scale = dev(cdy.scale), .amax = dev(Tensor::zeros({1})), .format = gfmt};

    Tensor y_ref = Tensor::empty({n, out});
    ops::cpu::fp8_linear_fwd(y_ref, x, w, nullptr, cx, cw, nullptr, {});
    Tensor y = poisoned({n, out}, DType::BF16);
    ops::fp8_linear_fwd(y, dev(x, DType::BF16), dev(w, DType::BF16), nullptr, gx, gw, nullptr);
    // the same fp8 operands and exact products; what differs is the accumulation: Hopper's FP8 tensor cores add with
    // ~14 mantissa bits (DeepSeek-V3, section 3.3.2), the fast-accumulation forward never promoting to fp32 within
    // the call (k = 192: ~1e-3), then the bf16 output rounding (2^-9): 1e-2 relative
    EXPECT_REL(host(y), y_ref, 1e-2);
    EXPECT_EQ(host(gx.amax).data<float>()[0], cx.amax.data<float>()[0]);
    EXPECT_EQ(host(gw.amax).data<float>()[0], cw.amax.data<float>()[0]);
    // with a bias: cuBLASLt's FP8 bias epilogue (added in fp32 before y's rounding) vs the emulation's fp32 add
    const Tensor bias = dev(rnd({out}, 46, DType::F32, -0.5, 0.5), DType::BF16);
    Tensor yb_ref = Tensor::empty({n, out}), yb = poisoned({n, out}, DType::BF16);
    const Tensor bias_ref = host(bias);
    ops::cpu::fp8_linear_fwd(yb_ref, x, w, &bias_ref, cx, cw, nullptr, {});
    ops::fp8_linear_fwd(yb, dev(x, DType::BF16), dev(w, DType::BF16), &bias, gx, gw, nullptr);
    EXPECT_REL(host(yb), yb_ref, 1e-2);

    Tensor dx_ref = Tensor::empty({n, in}), dw_ref = rnd({out, in}, 44, DType::F32, -1e-3, 1e-3);
    Tensor db_ref = Tensor::zeros({out});
    Tensor dw = dev(dw_ref), db = dev(db_ref), dx = poisoned({n, in}, DType::BF16);
    ops::cpu::fp8_linear_bwd(&dx_ref, dw_ref, &db_ref, dy, x, w, cdy, cx, cw, nullptr, ops::GradWrite::Accumulate, {});
    ops::fp8_linear_bwd(&dx, dw, &db, dev(dy, DType::BF16), dev(x, DType::BF16), dev(w, DType::BF16), gdy, gx, gw,
                        nullptr, ops::GradWrite::Accumulate);
    // dgrad / wgrad without fast accumulation: the tensor cores' ~14-bit partial sums promoted to fp32 every few
    // k-blocks (~2^-14 relative); dx then rounded to bf16 (2^-9): 5e-3; dw in fp32 (plus the accumulated dw): 1e-3
    EXPECT_REL(host(dx), dx_ref, 5e-3);
    EXPECT_REL(host(dw), dw_ref, 1e-3);
    EXPECT_REL(host(db), db_ref, 1e-5);  // column sums of the bf16 dy, fp32
    EXPECT_EQ(host(gdy.amax).data<float>()[0], cdy.amax.data<float>()[0]);

    Tensor dw_over = dev(rnd({out, in}, 45)), dw_over_ref = Tensor::empty({out, in});
    ops::cpu::fp8_linear_bwd(nullptr, dw_over_ref, nullptr, dy, x, w, cdy, cx, cw, nullptr, ops::GradWrite::Overwrite,
                             {});
    ops::fp8_linear_bwd(nullptr, dw_over, nullptr, dev(dy, DType::BF16), dev(x, DType::BF16), dev(w, DType::BF16), gdy,
                        gx, gw, nullptr, ops::GradWrite::Overwrite);
    EXPECT_REL(host(dw_over), dw_over_ref, 1e-3);  // as dw above

    // the forward's saved transposed casts (ops.h Fp8Saved; one cast-transpose pass each) give the same y, and the
    // backward without x the same dx, dw and db, bit for bit (the same fp8 bytes into the same GEMMs)
    Tensor y2 = poisoned({n, out}, DType::BF16), dx2 = poisoned({n, in}, DType::BF16);
    Tensor dw2 = dev(dw_ref), db2 = dev(db_ref);
    Tensor dx1 = poisoned({n, in}, DType::BF16), dw1 = dev(dw_ref), db1 = dev(db_ref);
    ops::Fp8Saved saved;
    ops::fp8_linear_fwd(y2, dev(x, DType::BF16), dev(w, DType::BF16), nullptr, gx, gw, &saved);
    ops::fp8_linear_bwd(&dx1, dw1, &db1, dev(dy, DType::BF16), dev(x, DType::BF16), dev(w, DType::BF16), gdy, gx, gw,
                        nullptr, ops::GradWrite::Accumulate);
    ops::fp8_linear_bwd(&dx2, dw2, &db2, dev(dy, DType::BF16), Tensor(), dev(w, DType::BF16), gdy, gx, gw, &saved,
                        ops::GradWrite::Accumulate);
    auto same = [](const Tensor& a, const Tensor& b) {
      const Tensor ha = host(a), hb = host(b);
      return std::memcmp(ha.data<float>(), hb.data<float>(), ha.numel() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(y2, y));
    EXPECT_TRUE(same(dx2, dx1));
    EXPECT_TRUE(same(dw2, dw1));
    EXPECT_TRUE(same(db2, db1));
  }
}

// FP8 GEMM autotuning (fp8_gemm.h): with the switch on, the first call of each new plan times its candidates — the
// forward (bias, fast accumulation), the dgrad and the wgrad accumulating into a non-zero fp32 main grad — and matches
// the CPU emulation on that call and the next (the timing writes only its scratch: a wgrad accumulated twice fails);
// the second call tunes nothing more. Shapes no other test uses, so every plan is new.
TEST(CudaFp8, GemmsAreAutotunedAndMatchOnTheTuningCall) {
  MCPP_REQUIRE_CUDA();
  const bool prev = ops::cuda::gemm_autotune();
  ops::cuda::set_gemm_autotune(true);
  const int64_t n = 336, in = 208, out = 176;
  Tensor x = rnd({n, in}, 51, DType::BF16, -2.0, 2.0), w = rnd({out, in}, 52, DType::BF16, -0.1, 0.1);
  Tensor dy = rnd({n, out}, 53, DType::BF16, -1e-3, 1e-3), bias = rnd({out}, 54, DType::BF16, -0.5, 0.5);
  const ops::Fp8Operand cx{.scale = scale_tensor(224.0f)}, cw{.scale = scale_tensor(4480.0f)};
  const ops::Fp8Operand cdy{.scale = scale_tensor(5.7344e7f), .format = Fp8Format::E5M2};
  const ops::Fp8Operand gx{.scale = dev(cx.scale)}, gw{.scale = dev(cw.scale)};
  const ops::Fp8Operand gdy{.scale = dev(cdy.scale), .format = Fp8Format::E5M2};
  const Tensor xd = dev(x, DType::BF16), wd = dev(w, DType::BF16), dyd = dev(dy, DType::BF16);
  const Tensor biasd = dev(bias, DType::BF16), bias_ref = host(biasd);
  Tensor y_ref = Tensor::empty({n, out}), dx_ref = Tensor::empty({n, in});
  Tensor dw_ref = rnd({out, in}, 55, DType::F32, -1e-3, 1e-3), dw = dev(dw_ref);
  const size_t before = ops::cuda::gemm_tune_records().size();
  size_t after_first = 0;
  for (int call = 1; call <= 2; ++call) {
    SCOPED_TRACE(call);
    Tensor y = poisoned({n, out}, DType::BF16), dx = poisoned({n, in}, DType::BF16);
    ops::cpu::fp8_linear_fwd(y_ref, x, w, &bias_ref, cx, cw, nullptr, {});
    ops::fp8_linear_fwd(y, xd, wd, &biasd, gx, gw, nullptr);
    ops::cpu::fp8_linear_bwd(&dx_ref, dw_ref, nullptr, dy, x, w, cdy, cx, cw, nullptr, ops::GradWrite::Accumulate, {});
    ops::fp8_linear_bwd(&dx, dw, nullptr, dyd, xd, wd, gdy, gx, gw, nullptr, ops::GradWrite::Accumulate);
    EXPECT_REL(host(y), y_ref, 1e-2);  // the tolerances of GemmsMatchTheCpuEmulation
    EXPECT_REL(host(dx), dx_ref, 5e-3);
    EXPECT_REL(host(dw), dw_ref, 1e-3);
    const auto recs = ops::cuda::gemm_tune_records();
    if (call == 1) {
      after_first = recs.size();
      int fp8 = 0;
      for (size_t i = before; i < recs.size(); ++i) {
        if (!recs[i].gemm.starts_with("fp8 ")) continue;
        ++fp8;
        EXPECT_TRUE(recs[i].note.empty()) << recs[i].gemm << ": " << recs[i].note;
        EXPECT_GE(recs[i].candidate_ms.size(), 1u) << recs[i].gemm;
        EXPECT_LT(recs[i].chosen, static_cast<int>(recs[i].candidate_config.size())) << recs[i].gemm;
        std::printf("[ tuned    ] %s: chosen #%d of %zu\n", recs[i].gemm.c_str(), recs[i].chosen,
                    recs[i].candidate_ms.size());
      }
      EXPECT_EQ(fp8, 3) << "the forward, dgrad and wgrad plans are tuned at their first call";
    } else {
      EXPECT_EQ(recs.size(), after_first) << "the second call tuned again";
    }
  }
  ops::cuda::set_gemm_autotune(prev);
}

// The GELU in fc2's input cast and gelu' in fc1's gradient cast (ops.h Fp8Act) against the unfused ops on the GPU
// (gelu_fwd / gelu_bwd written out in bf16, then the plain FP8 linear): the same fp8 bytes, so y, dx, dw, db and the
// amax records bit for bit; and the CPU emulation of the fused op within the GEMMs' tolerance. With a bias, so the
// bias gradient's column sums ride in the same pass (cast_transpose_dbias).
TEST(CudaFp8, ActivationInTheCastIsTheUnfusedOps) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 256, in = 192, out = 160;
  const Tensor pre = dev(rnd({n, in}, 51, DType::BF16, -3.0, 3.0), DType::BF16);
  const Tensor w = dev(rnd({out, in}, 52, DType::BF16, -0.1, 0.1), DType::BF16);
  auto operand = [](float s, Fp8Format f = Fp8Format::E4M3) {
    return ops::Fp8Operand{.scale = dev(scale_tensor(s)), .amax = dev(Tensor::zeros({1})), .format = f};
  };
  auto same = [](const Tensor& a, const Tensor& b) {
    const Tensor ha = host(a), hb = host(b);
    return ha.numel() == hb.numel() && std::memcmp(ha.data<float>(), hb.data<float>(), ha.numel() * 4) == 0;
  };
  Tensor act = Tensor::empty({n, in}, DType::BF16, Device::CUDA);
  ops::gelu_fwd(act, pre);
  ops::Fp8Operand fx = operand(448.0f / 3.0f), fx_gelu = operand(448.0f / 3.0f), fw = operand(4480.0f);
  fx_gelu.act = ops::Fp8Act::Gelu;
  Tensor y = poisoned({n, out}, DType::BF16), y_fused = poisoned({n, out}, DType::BF16);
  ops::Fp8Saved saved, saved_fused;
  ops::fp8_linear_fwd(y, act, w, nullptr, fx, fw, &saved);
  ops::fp8_linear_fwd(y_fused, pre, w, nullptr, fx_gelu, fw, &saved_fused);
  EXPECT_TRUE(same(y_fused, y));
  {  // the saved q(x)^T: n * in fp8 bytes, then (n * in is a multiple of 16 here) the scale_inv; the rest is padding
    const Tensor a = host(saved_fused.x), b = host(saved.x);
    ASSERT_EQ(a.numel(), b.numel());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), n * in + 4), 0);
  }
  EXPECT_TRUE(same(fx_gelu.amax, fx.amax));
  Tensor y_ref = Tensor::empty({n, out});  // the emulation of the fused op (fp32 GELU: bf16 rounding differs a bit)
  ops::Fp8Operand cx{.scale = host(fx.scale), .amax = Tensor::zeros({1}), .act = ops::Fp8Act::Gelu};
  ops::cpu::fp8_linear_fwd(y_ref, host(pre), host(w), nullptr, cx, {.scale = host(fw.scale)}, nullptr, {});
  EXPECT_REL(host(y_fused), y_ref, 3e-2);

  const Tensor x = dev(rnd({n, in}, 53, DType::BF16, -2.0, 2.0), DType::BF16);
  const Tensor dact = dev(rnd({n, out}, 54, DType::BF16, -1e-3, 1e-3), DType::BF16);
  const Tensor pre_out = dev(rnd({n, out}, 55, DType::BF16, -3.0, 3.0), DType::BF16);
  Tensor dpre = Tensor::empty({n, out}, DType::BF16, Device::CUDA);
  ops::gelu_bwd(dpre, dact, pre_out);
  ops::Fp8Operand fdy = operand(57344.0f / 1e-3f, Fp8Format::E5M2), fdy_gelu = operand(57344.0f / 1e-3f, Fp8Format::E5M2);
  fdy_gelu.act = ops::Fp8Act::DGelu;
  fdy_gelu.act_input = pre_out;
  const ops::Fp8Operand fxb = operand(448.0f / 2.0f);
  const Tensor dw0 = rnd({out, in}, 56, DType::F32, -1e-3, 1e-3);
  Tensor dx = poisoned({n, in}, DType::BF16), dw = dev(dw0), db = dev(Tensor::zeros({out}));
  Tensor dx2 = poisoned({n, in}, DType::BF16), dw2 = dev(dw0), db2 = dev(Tensor::zeros({out}));
  ops::fp8_linear_bwd(&dx, dw, &db, dpre, x, w, fdy, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  ops::fp8_linear_bwd(&dx2, dw2, &db2, dact, x, w, fdy_gelu, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  EXPECT_TRUE(same(dx2, dx));
  EXPECT_TRUE(same(dw2, dw));
  EXPECT_TRUE(same(db2, db));
  EXPECT_TRUE(same(fdy_gelu.amax, fdy.amax));
  Tensor db_ref = Tensor::zeros({out});  // the bias gradient: fp32 column sums of the bf16 dpre
  {
    const Tensor hd = host(dpre);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < out; ++c) db_ref.data<float>()[c] += hd.data<float>()[r * out + c];
  }
  EXPECT_REL(host(db2), db_ref, 1e-5);
}

// SwiGLU in fc2's input cast and swiglu_bwd in fc1's gradient cast (ops.h Fp8Act::Swiglu / DSwiglu) against the
// unfused ops on the GPU (swiglu_fwd / swiglu_bwd written out in bf16, then the plain FP8 linear): the same fp8 bytes,
// so y, the saved q(x)^T, dx, dw, db and the amax records bit for bit.
TEST(CudaFp8, SwigluInTheCastIsTheUnfusedOps) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 256, in = 192, out = 320;
  const Tensor pre = dev(rnd({n, 2 * in}, 71, DType::BF16, -3.0, 3.0), DType::BF16);
  const Tensor w = dev(rnd({out, in}, 72, DType::BF16, -0.1, 0.1), DType::BF16);
  auto operand = [](float s, Fp8Format f = Fp8Format::E4M3) {
    return ops::Fp8Operand{.scale = dev(scale_tensor(s)), .amax = dev(Tensor::zeros({1})), .format = f};
  };
  auto same = [](const Tensor& a, const Tensor& b, int64_t bytes) {
    const Tensor ha = host(a), hb = host(b);
    return ha.numel() == hb.numel() && std::memcmp(ha.raw(), hb.raw(), bytes) == 0;
  };
  Tensor act = Tensor::empty({n, in}, DType::BF16, Device::CUDA);
  ops::swiglu_fwd(act, pre);
  ops::Fp8Operand fx = operand(448.0f / 8.0f), fx_swiglu = operand(448.0f / 8.0f), fw = operand(4480.0f);
  fx_swiglu.act = ops::Fp8Act::Swiglu;
  Tensor y = poisoned({n, out}, DType::BF16), y_fused = poisoned({n, out}, DType::BF16);
  ops::Fp8Saved saved, saved_fused;
  ops::fp8_linear_fwd(y, act, w, nullptr, fx, fw, &saved);
  ops::fp8_linear_fwd(y_fused, pre, w, nullptr, fx_swiglu, fw, &saved_fused);
  EXPECT_TRUE(same(y_fused, y, n * out * 2));
  EXPECT_TRUE(same(saved_fused.x, saved.x, n * in + 4)) << "q(x)^T, then its scale_inv";
  EXPECT_TRUE(same(fx_swiglu.amax, fx.amax, 4));

  const Tensor x = dev(rnd({n, in}, 73, DType::BF16, -2.0, 2.0), DType::BF16);
  const Tensor dact = dev(rnd({n, out / 2}, 74, DType::BF16, -1e-3, 1e-3), DType::BF16);
  const Tensor pre_out = dev(rnd({n, out}, 75, DType::BF16, -3.0, 3.0), DType::BF16);
  Tensor dpre = Tensor::empty({n, out}, DType::BF16, Device::CUDA);
  ops::swiglu_bwd(dpre, dact, pre_out);
  ops::Fp8Operand fdy = operand(57344.0f / 1e-2f, Fp8Format::E5M2);
  ops::Fp8Operand fdy_swiglu = operand(57344.0f / 1e-2f, Fp8Format::E5M2);
  fdy_swiglu.act = ops::Fp8Act::DSwiglu;
  fdy_swiglu.act_input = pre_out;
  const ops::Fp8Operand fxb = operand(448.0f / 2.0f);
  const Tensor dw0 = rnd({out, in}, 76, DType::F32, -1e-3, 1e-3);
  Tensor dx = poisoned({n, in}, DType::BF16), dw = dev(dw0), db = dev(Tensor::zeros({out}));
  Tensor dx2 = poisoned({n, in}, DType::BF16), dw2 = dev(dw0), db2 = dev(Tensor::zeros({out}));
  ops::fp8_linear_bwd(&dx, dw, &db, dpre, x, w, fdy, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  ops::fp8_linear_bwd(&dx2, dw2, &db2, dact, x, w, fdy_swiglu, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  EXPECT_TRUE(same(dx2, dx, n * in * 2));
  EXPECT_TRUE(same(dw2, dw, out * in * 4));
  EXPECT_TRUE(same(db2, db, out * 4));
  EXPECT_TRUE(same(fdy_swiglu.amax, fdy.amax, 4));
}

// A LayerNorm / RMSNorm in the input's cast (ops.h Fp8Act::Norm), from the statistics the norm's forward wrote without
// its output, against the norm written out in bf16, then the plain FP8 linear: the same fp8 bytes, so y, the saved
// q(x)^T and the amax bit for bit — after a plain norm and after the fused residual add + norm.
TEST(CudaFp8, NormInTheCastIsTheNormThenTheLinear) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 256, h = 512, out = 160;
  const Tensor a = dev(rnd({n, h}, 61, DType::BF16, -2.0, 2.0), DType::BF16);
  const Tensor b = dev(rnd({n, h}, 62, DType::BF16, -1.0, 1.0), DType::BF16);
  const Tensor gamma = dev(rnd({h}, 63, DType::F32, 0.5, 1.5)), beta = dev(rnd({h}, 64, DType::F32, -0.5, 0.5));
  const Tensor w = dev(rnd({out, h}, 65, DType::BF16, -0.1, 0.1), DType::BF16);
  auto operand = [](float s) {
    return ops::Fp8Operand{.scale = dev(scale_tensor(s)), .amax = dev(Tensor::zeros({1}))};
  };
  auto same = [](const Tensor& x, const Tensor& y, int64_t bytes) {
    const Tensor hx = host(x), hy = host(y);
    return hx.numel() == hy.numel() && std::memcmp(hx.raw(), hy.raw(), bytes) == 0;
  };
  auto stat = [&] { return Tensor::empty({n}, DType::F32, Device::CUDA); };
  for (const bool layernorm : {true, false})
    for (const bool add : {false, true}) {
      SCOPED_TRACE(std::string(layernorm ? "LayerNorm" : "RMSNorm") + (add ? ", fused add" : ""));
      Tensor x = add ? Tensor::empty({n, h}, DType::BF16, Device::CUDA) : a, none;
      Tensor ln = poisoned({n, h}, DType::BF16), mean = stat(), rstd = stat(), mean2 = stat(), rstd2 = stat();
      testing::norm_forward(layernorm, add, x, ln, mean, rstd, a, b, gamma, beta, 1e-5f);
      testing::norm_forward(layernorm, add, x, none, mean2, rstd2, a, b, gamma, beta, 1e-5f);  // statistics only
      EXPECT_TRUE(same(rstd2, rstd, n * 4)) << "the statistics without the output";
      if (layernorm) {
        EXPECT_TRUE(same(mean2, mean, n * 4));
      }
      ops::Fp8Operand fx = operand(448.0f / 4.0f), fx_norm = operand(448.0f / 4.0f), fw = operand(4480.0f);
      fx_norm.act = ops::Fp8Act::Norm;
      fx_norm.norm = {.mean = layernorm ? mean2 : Tensor(), .rstd = rstd2, .weight = gamma,
                      .bias = layernorm ? beta : Tensor(), .eps = 1e-5f};
      Tensor y = poisoned({n, out}, DType::BF16), y_fused = poisoned({n, out}, DType::BF16);
      ops::Fp8Saved saved, saved_fused;
      ops::fp8_linear_fwd(y, ln, w, nullptr, fx, fw, &saved);
      ops::fp8_linear_fwd(y_fused, x, w, nullptr, fx_norm, fw, &saved_fused);
      EXPECT_TRUE(same(y_fused, y, n * out * 2));
      EXPECT_TRUE(same(saved_fused.x, saved.x, n * h + 4)) << "q(x)^T, then its scale_inv";
      EXPECT_TRUE(same(fx_norm.amax, fx.amax, 4));
      Tensor y_raw = poisoned({n, out}, DType::BF16);
      ops::fp8_linear_fwd(y_raw, x, w, nullptr, fx, fw, nullptr);
      EXPECT_FALSE(same(y_raw, y, n * out * 2)) << "the norm is applied";
    }
}

Config fp8_gpu_config(const std::string& data, const std::string& format, const std::string& recipe) {
  Config c = training_test::gpu_train_config(data);
  c.training.bf16 = true;
  c.model.fp8_format = format;
  c.model.fp8_recipe = recipe;
  c.model.fp8_amax_history_len = 16;
  c.model.fp8_amax_compute_algo = "max";
  c.validate();
  return c;
}

TEST(CudaFp8Training, LossFollowsTheBf16Run) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_fp8_gpu_" + std::to_string(::getpid()));
  const std::string data = training_test::make_corpus(dir);
  Config base = training_test::gpu_train_config(data);
  base.training.bf16 = true;
  base.validate();
  const TrainSummary ref = Trainer(base, 99, training_test::single()).train();
  for (const auto& [format, recipe] : {std::pair<std::string, std::string>{"e4m3", "delayed"}, {"hybrid", "delayed"},
                                       {"hybrid", "tensorwise"}}) {
    SCOPED_TRACE(format + " " + recipe);
    const TrainSummary s = Trainer(fp8_gpu_config(data, format, recipe), 99, training_test::single()).train();
    ASSERT_EQ(s.losses.size(), ref.losses.size());
    // FP8's per-element error (e4m3 2^-4, e5m2 2^-3 relative) over 8 steps of a d128 GPT: within 3% of bf16's loss
    // (the CPU emulation's measured gap at 30 steps is below that; tests/training/fp8_training_test.cpp)
    for (size_t i = 0; i < s.losses.size(); ++i)
      EXPECT_NEAR(s.losses[i], ref.losses[i], 0.03 * ref.losses[i]) << "iteration " << i + 1;
    EXPECT_NE(s.losses.back(), ref.losses.back()) << "the FP8 GEMMs are in the path";
  }
  std::filesystem::remove_all(dir);
}

TEST(CudaFp8Training, ResumeIsBitExactWithTheScalingState) {
  MCPP_REQUIRE_CUDA();
  const KernelSettingsScope restore;  // --deterministic-mode below changes them process-wide
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_fp8_resume_" + std::to_string(::getpid()));
  Config c = fp8_gpu_config(training_test::make_corpus(dir), "hybrid", "delayed");
  c.model.deterministic_mode = true;
  c.validate();
  training_test::expect_resume_bit_exact(c, dir / "ckpt");
  std::filesystem::remove_all(dir);
}

// The norms in the FP8 input casts (transformer_layer.h) against the norms written out ("layernorm" recompute keeps
// them unfused; its re-run writes the same bits): under --deterministic-mode the same losses, exactly.
TEST(CudaFp8Training, NormsInTheCastsEqualTheNormsWrittenOut) {
  MCPP_REQUIRE_CUDA();
  const KernelSettingsScope restore;
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_fp8_norm_" + std::to_string(::getpid()));
  Config c = fp8_gpu_config(training_test::make_corpus(dir), "hybrid", "delayed");
  c.model.deterministic_mode = true;
  c.validate();
  const TrainSummary in_cast = Trainer(c, 99, training_test::single()).train();
  c.model.recompute_granularity = "selective";
  c.model.recompute_modules = {"layernorm"};
  c.validate();
  const TrainSummary written = Trainer(c, 99, training_test::single()).train();
  ASSERT_EQ(in_cast.losses.size(), written.losses.size());
  for (size_t i = 0; i < written.losses.size(); ++i)
    EXPECT_EQ(in_cast.losses[i], written.losses[i]) << "iteration " << i + 1;
  std::filesystem::remove_all(dir);
}

// FP8 under --enable-cuda-graph: the casts, amax records and delayed-scaling updates run on the device, so each replay
// moves the scales as the eager step does. --deterministic-mode (GEMM autotuning off, deterministic kernels): the
// graphed run equals the eager one to the loss read-back's rounding; a replay that reused the captured step's scales
// would cast with others and differ well beyond that.
TEST(CudaFp8Training, GraphReplaysMatchEagerTraining) {
  MCPP_REQUIRE_CUDA();
  const KernelSettingsScope restore;
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_fp8_graph_" + std::to_string(::getpid()));
  for (const char* recipe : {"delayed", "tensorwise"}) {
    SCOPED_TRACE(recipe);
    Config c = fp8_gpu_config(training_test::make_corpus(dir), "hybrid", recipe);
    c.model.deterministic_mode = true;
    c.validate();
    const TrainSummary eager = Trainer(c, 99, training_test::single()).train();
    const TrainSummary graphed = training_test::train_graphed(c);
    ASSERT_EQ(graphed.losses.size(), eager.losses.size());
    EXPECT_EQ(graphed.cuda_graph_replays, static_cast<int64_t>(eager.losses.size()) - 2);
    for (size_t i = 0; i < eager.losses.size(); ++i)
      EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-6 * eager.losses[i]) << "iteration " << i + 1;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mcpp::cuda_test
