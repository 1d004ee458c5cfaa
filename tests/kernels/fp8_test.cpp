// The CPU FP8 emulation (kernels/cpu/fp8.cpp), the oracle of the CUDA FP8 kernels:
//   - fp8_round against a table computed by the formats' definition in float64 (tests/oracle/fp8_ref.py: all 256 codes
//     decoded, nearest value, ties to the even code, saturation; every value, midpoint and its neighbours, plus 2000
//     random values over 2^-20..2^18);
//   - fp8_quantize / fp8_amax: the op applies the scale in fp32 before rounding and records max |x|;
//   - fp8_scale_update against Transformer Engine's delayed-scaling functions (_default_get_amax_and_update_history,
//     _update_amax_history, _default_sf_compute), written out below step by step; fp8_scale_update_multi against it;
//   - fp8_linear_fwd / _bwd against a float64 GEMM of the emulated operands, and against the unquantized fp32 linear
//     within FP8's error.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/core_test_util.h"
#include "kernels/grad_check.h"
#include "kernels/norm_forward.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

using ops::Fp8Format;
using testing::random_tensor;

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t b) { return std::bit_cast<float>(b); }

TEST(Fp8Round, MatchesTheFormatsDefinition) {
  std::ifstream in(std::string(MCPP_SOURCE_DIR) + "/tests/fixtures/fp8/rounding.tsv");
  ASSERT_TRUE(in) << "tests/fixtures/fp8/rounding.tsv (tests/oracle/fp8_ref.py)";
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    uint32_t x = 0, e4 = 0, e5 = 0;
    ss >> std::hex >> x >> e4 >> e5;
    const float v = from_bits(x);
    for (const auto& [fmt, want] : {std::pair{Fp8Format::E4M3, e4}, std::pair{Fp8Format::E5M2, e5}}) {
      const float got = ops::fp8_round(v, fmt);
      if (std::isnan(from_bits(want))) {
        EXPECT_TRUE(std::isnan(got)) << std::hex << x;
      } else {
        ASSERT_EQ(bits(got), want) << "input " << v << " (0x" << std::hex << x << ") format "
                                   << (fmt == Fp8Format::E4M3 ? "e4m3" : "e5m2");
      }
    }
    ++n;
  }
  EXPECT_GT(n, 3000);
}

TEST(Fp8Quantize, ScalesInFp32RoundsAndRecordsAmax) {
  Tensor x = testing::random_tensor({37, 19}, 3, nullptr, -3.0, 3.0);
  x.data<float>()[5] = -7.5f;  // the amax
  for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    Tensor scale = Tensor::empty({2});
    scale.data<float>()[0] = 37.3f;  // saturates e4m3 past 448 / 37.3 = 12: none here; e5m2 none either
    scale.data<float>()[1] = 1.0f / 37.3f;
    Tensor out = Tensor::empty(x.shape()), amax = Tensor::zeros({1});
    amax.data<float>()[0] = 2.0f;  // an earlier record below this tensor's amax
    ops::fp8_quantize(out, &amax, x, scale, fmt);
    for (int64_t i = 0; i < x.numel(); ++i)
      ASSERT_EQ(bits(out.data<float>()[i]), bits(ops::fp8_round(x.data<float>()[i] * 37.3f, fmt))) << i;
    EXPECT_EQ(amax.data<float>()[0], 7.5f);
    ops::fp8_amax(amax, x);  // max with itself: unchanged
    EXPECT_EQ(amax.data<float>()[0], 7.5f);
  }
}

// Transformer Engine's delayed-scaling update, transcribed (fp32 tensors there; float here):
//   amax = max(history) | history[0];  history = roll(history, -1); history[0] = 0
//   sf = (fp8_max / amax) / 2^margin;  sf = where(amax > 0, sf, scale);  sf = where(isfinite(amax), sf, scale)
struct TeRef {
  std::vector<float> history;
  float scale = 1.0f;
  void update(bool most_recent, float fp8_max, int margin) {
    float amax = history[0];
    if (!most_recent)
      for (float h : history) amax = std::isnan(h) || std::isnan(amax) ? NAN : std::max(amax, h);
    std::vector<float> rolled(history.size());
    for (size_t i = 0; i < history.size(); ++i) rolled[i] = history[(i + 1) % history.size()];
    history = rolled;
    history[0] = 0.0f;
    float sf = (fp8_max / amax) / std::pow(2.0f, static_cast<float>(margin));
    if (!(amax > 0.0f)) sf = scale;
    if (!std::isfinite(amax)) sf = scale;
    scale = sf;
  }
};

TEST(Fp8ScaleUpdate, MatchesTransformerEnginesDelayedScaling) {
  const std::vector<float> amaxes{3.0f, 0.5f, 0.0f, 12.0f, 1e-30f, INFINITY, 2.0f, 0.25f, 7.0f};
  for (bool most_recent : {false, true})
    for (int margin : {0, 2})
      for (Fp8Format fmt : {Fp8Format::E4M3, Fp8Format::E5M2})
        for (int64_t len : {1, 4}) {
          SCOPED_TRACE(::testing::Message() << "most_recent " << most_recent << " margin " << margin << " len " << len);
          TeRef ref{.history = std::vector<float>(static_cast<size_t>(len), 0.0f)};
          Tensor scale = Tensor::empty({2}), hist = Tensor::zeros({len});
          scale.fill_(1.0f);
          for (float a : amaxes) {
            hist.data<float>()[0] = a;  // what the step's casts recorded
            ref.history[0] = a;
            ops::fp8_scale_update(scale, hist, {.format = fmt, .margin = margin, .most_recent = most_recent});
            ref.update(most_recent, ops::fp8_max(fmt), margin);
            ASSERT_EQ(scale.data<float>()[0], ref.scale) << "after amax " << a;
            ASSERT_EQ(scale.data<float>()[1], 1.0f / ref.scale);
            for (int64_t i = 0; i < len; ++i) ASSERT_EQ(hist.data<float>()[i], ref.history[static_cast<size_t>(i)]);
          }
        }
}

// fp8_scale_update_multi: each entry as the per-tensor op after its amax slot's value went into history[0] (the op
// above is the oracle), the scale before it copied out where asked, the listed slots zeroed, the others untouched;
// 150 entries of mixed lengths, formats, margins and algorithms, histories and amaxes with zeros, NaN and inf, slots
// in a shuffled order with two left out.
TEST(Fp8ScaleUpdate, MultiIsThePerTensorUpdateOfEachEntry) {
  const int64_t k = 152;
  Tensor amax = random_tensor({k}, 31, nullptr, 0.0, 500.0);
  amax.data<float>()[3] = 0.0f;
  amax.data<float>()[7] = NAN;
  amax.data<float>()[11] = INFINITY;
  std::vector<ops::Fp8ScaleState> list, ref;
  const int64_t lens[] = {1, 2, 5, 16, 1024};
  for (int64_t e = 0; e < k - 2; ++e) {
    const int64_t len = lens[e % 5];
    Tensor hist = random_tensor({len}, 100 + static_cast<uint64_t>(e), nullptr, 0.0, 300.0), scale = Tensor::empty({2});
    if (e % 13 == 0) hist.data<float>()[len - 1] = NAN;
    scale.data<float>()[0] = 2.0f;
    scale.data<float>()[1] = 0.5f;
    const ops::Fp8ScalingOptions opt{.format = e % 2 ? Fp8Format::E5M2 : Fp8Format::E4M3,
                                     .margin = static_cast<int>(e % 3),
                                     .most_recent = e % 4 == 1};
    list.push_back({.scale = scale,
                    .amax_history = hist,
                    .amax_slot = (e * 37 + 5) % k,
                    .opt = opt,
                    .scale_before = e % 2 ? Tensor() : Tensor::zeros({2})});
    ref.push_back(
        {.scale = scale.clone(), .amax_history = hist.clone(), .amax_slot = list.back().amax_slot, .opt = opt});
  }
  const Tensor amax_before = amax.clone();
  ops::fp8_scale_update_multi(list, amax);
  std::vector<bool> listed(k, false);
  for (size_t e = 0; e < list.size(); ++e) {
    SCOPED_TRACE(e);
    const int64_t slot = ref[e].amax_slot;
    listed[static_cast<size_t>(slot)] = true;
    ref[e].amax_history.data<float>()[0] = amax_before.data<float>()[slot];
    ops::fp8_scale_update(ref[e].scale, ref[e].amax_history, ref[e].opt);
    EXPECT_EQ(0, std::memcmp(list[e].scale.raw(), ref[e].scale.raw(), 8));
    EXPECT_EQ(0, std::memcmp(list[e].amax_history.raw(), ref[e].amax_history.raw(), ref[e].amax_history.nbytes()));
    if (e % 2 == 0) {  // the scale before the update
      EXPECT_EQ(list[e].scale_before.data<float>()[0], 2.0f);
      EXPECT_EQ(list[e].scale_before.data<float>()[1], 0.5f);
    }
  }
  for (int64_t i = 0; i < k; ++i)
    EXPECT_EQ(bits(amax.data<float>()[i]), listed[static_cast<size_t>(i)] ? 0u : bits(amax_before.data<float>()[i]))
        << "slot " << i;
  std::vector<ops::Fp8ScaleState> twice{list[0], list[1]};
  twice[1].amax_slot = twice[0].amax_slot;
  EXPECT_THROW(ops::fp8_scale_update_multi(twice, amax), Error);
}

Tensor quantized(const Tensor& t, float scale, Fp8Format fmt) {
  Tensor q = Tensor::empty(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) q.data<float>()[i] = ops::fp8_round(t.data<float>()[i] * scale, fmt);
  return q;
}

Tensor scale_of(float s) {
  Tensor t = Tensor::empty({2});
  t.data<float>()[0] = s;
  t.data<float>()[1] = 1.0f / s;
  return t;
}

// c[i, j] = sum_k a[i, k] b[j, k] in double, times alpha (float32 out)
Tensor ref_abt(const Tensor& a, const Tensor& b, int64_t m, int64_t n, int64_t k, double alpha) {
  Tensor c = Tensor::empty({m, n});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l) s += double(a.data<float>()[i * k + l]) * b.data<float>()[j * k + l];
      c.data<float>()[i * n + j] = static_cast<float>(s * alpha);
    }
  return c;
}

Tensor transposed(const Tensor& t) {
  const int64_t r = t.size(0), c = t.size(1);
  Tensor o = Tensor::empty({c, r});
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) o.data<float>()[j * r + i] = t.data<float>()[i * c + j];
  return o;
}

double rel(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = double(got.data<float>()[i]) - want.data<float>()[i];
    num += d * d;
    den += double(want.data<float>()[i]) * want.data<float>()[i];
  }
  return std::sqrt(num / den);
}

TEST(Fp8Linear, ForwardAndBackwardAreGemmsOfTheEmulatedOperands) {
  const int64_t n = 48, in = 32, out = 24;
  Tensor x = testing::random_tensor({n, in}, 1, nullptr, -2.0, 2.0), w = testing::random_tensor({out, in}, 2, nullptr, -0.1, 0.1);
  Tensor dy = testing::random_tensor({n, out}, 3, nullptr, -1e-3, 1e-3);
  const float sx = 448.0f / 2.0f, sw = 448.0f / 0.1f, sdy = 57344.0f / 1e-3f;  // scales from the ranges' amax
  const ops::Fp8Operand fx{.scale = scale_of(sx), .amax = Tensor::zeros({1})};
  const ops::Fp8Operand fw{.scale = scale_of(sw), .amax = Tensor::zeros({1})};
  const ops::Fp8Operand fdy{.scale = scale_of(sdy), .amax = Tensor::zeros({1}), .format = Fp8Format::E5M2};
  const Tensor qx = quantized(x, sx, Fp8Format::E4M3), qw = quantized(w, sw, Fp8Format::E4M3);
  const Tensor qdy = quantized(dy, sdy, Fp8Format::E5M2);

  Tensor y = Tensor::empty({n, out});
  ops::fp8_linear_fwd(y, x, w, nullptr, fx, fw, nullptr);
  // fp32 accumulation (OpenBLAS) of exact fp8 products vs double: 1e-6 relative
  EXPECT_LT(rel(y, ref_abt(qx, qw, n, out, in, (1.0 / sx) * (1.0 / sw))), 1e-6);
  Tensor y32 = Tensor::empty({n, out});
  ops::linear_fwd(y32, x, w, nullptr);
  // e4m3 keeps 3 mantissa bits (<= 2^-4 relative per operand, random signs average out): ~3% on the output
  EXPECT_LT(rel(y, y32), 0.06);
  float x_amax = 0.0f, w_amax = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) x_amax = std::max(x_amax, std::fabs(x.data<float>()[i]));
  for (int64_t i = 0; i < w.numel(); ++i) w_amax = std::max(w_amax, std::fabs(w.data<float>()[i]));
  EXPECT_EQ(fx.amax.data<float>()[0], x_amax);  // the forward records both operands' amax
  EXPECT_EQ(fw.amax.data<float>()[0], w_amax);

  Tensor dx = Tensor::empty({n, in}), dw = testing::random_tensor({out, in}, 4), db = Tensor::zeros({out});
  const Tensor dw0 = dw.clone();
  ops::fp8_linear_bwd(&dx, dw, &db, dy, x, w, fdy, fx, fw, nullptr, ops::GradWrite::Accumulate);
  EXPECT_LT(rel(dx, ref_abt(qdy, transposed(qw), n, in, out, (1.0 / sdy) * (1.0 / sw))), 1e-6);
  Tensor dw_prod = ref_abt(transposed(qdy), transposed(qx), out, in, n, (1.0 / sdy) * (1.0 / sx));
  Tensor dw_delta = Tensor::empty({out, in});
  for (int64_t i = 0; i < out * in; ++i) dw_delta.data<float>()[i] = dw.data<float>()[i] - dw0.data<float>()[i];
  EXPECT_LT(rel(dw_delta, dw_prod), 1e-5);  // the accumulation adds one fp32 rounding of dw's size
  Tensor db_ref = Tensor::zeros({out});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < out; ++j) db_ref.data<float>()[j] += dy.data<float>()[i * out + j];
  EXPECT_LT(rel(db, db_ref), 1e-6);  // the unquantized dy's column sums
  float dy_amax = 0.0f;
  for (int64_t i = 0; i < dy.numel(); ++i) dy_amax = std::max(dy_amax, std::fabs(dy.data<float>()[i]));
  EXPECT_EQ(fdy.amax.data<float>()[0], dy_amax);

  Tensor dw_over = testing::random_tensor({out, in}, 5), db_over = testing::random_tensor({out}, 6);
  ops::fp8_linear_bwd(nullptr, dw_over, &db_over, dy, x, w, fdy, fx, fw, nullptr, ops::GradWrite::Overwrite);
  EXPECT_LT(rel(dw_over, dw_prod), 1e-6);
  EXPECT_LT(rel(db_over, db_ref), 1e-6);

  // bad operands are named errors, checked before any dimension is read (a 1-D w, a zero-width w)
  auto bwd_error = [&](const Tensor& bad_w, Tensor& bad_dw) {
    return testing::error_of(
        [&] {
          ops::fp8_linear_bwd(nullptr, bad_dw, nullptr, dy, x, bad_w, fdy, fx, fw, nullptr, ops::GradWrite::Overwrite);
        });
  };
  Tensor w1 = Tensor::zeros({out * in}), dw1 = Tensor::zeros({out * in});
  EXPECT_NE(bwd_error(w1, dw1).find("w [out, in] and dw_acc like w"), std::string::npos) << bwd_error(w1, dw1);
  Tensor w0 = Tensor::zeros({out, 0}), dw0w = Tensor::zeros({out, 0});
  EXPECT_NE(bwd_error(w0, dw0w).find("dy [n, 24] and x [n, 0]"), std::string::npos) << bwd_error(w0, dw0w);
}

bool identical(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data<float>(), b.data<float>(), a.numel() * sizeof(float)) == 0;
}

// The forward's saved casts (ops.h Fp8Saved) give the backward the same operands: dx, dw and db equal to the backward
// that casts x and w itself, bit for bit, with x not passed at all; a saved copy of other shapes is a named error.
TEST(Fp8Linear, SavedCastsReplaceTheBackwardsOwn) {
  const int64_t n = 48, in = 32, out = 24;
  Tensor x = testing::random_tensor({n, in}, 11, nullptr, -2.0, 2.0);
  Tensor w = testing::random_tensor({out, in}, 12, nullptr, -0.1, 0.1);
  Tensor dy = testing::random_tensor({n, out}, 13, nullptr, -1e-3, 1e-3);
  const ops::Fp8Operand fx{.scale = scale_of(448.0f / 2.0f), .amax = Tensor::zeros({1})};
  const ops::Fp8Operand fw{.scale = scale_of(448.0f / 0.1f), .amax = Tensor::zeros({1})};
  const ops::Fp8Operand fdy{.scale = scale_of(57344.0f / 1e-3f), .format = Fp8Format::E5M2};
  Tensor y = Tensor::empty({n, out}), y_saved = Tensor::empty({n, out});
  ops::fp8_linear_fwd(y, x, w, nullptr, fx, fw, nullptr);
  ops::Fp8Saved saved;
  ops::fp8_linear_fwd(y_saved, x, w, nullptr, fx, fw, &saved);
  ASSERT_TRUE(saved.x.defined() && saved.w.defined());
  EXPECT_TRUE(identical(y_saved, y));
  // with a bias: the GEMM's result plus the bias, as linear_fwd adds it (fp32 here)
  const Tensor bias = testing::random_tensor({out}, 15, nullptr, -0.5, 0.5);
  Tensor yb = Tensor::empty({n, out}), y_plus = y.clone();
  ops::fp8_linear_fwd(yb, x, w, &bias, fx, fw, nullptr);
  ops::bias_add_inplace(y_plus, bias);
  EXPECT_TRUE(identical(yb, y_plus));
  Tensor dx = Tensor::empty({n, in}), dw = testing::random_tensor({out, in}, 14), db = Tensor::zeros({out});
  Tensor dx2 = Tensor::empty({n, in}), dw2 = dw.clone(), db2 = db.clone();
  ops::fp8_linear_bwd(&dx, dw, &db, dy, x, w, fdy, fx, fw, nullptr, ops::GradWrite::Accumulate);
  ops::fp8_linear_bwd(&dx2, dw2, &db2, dy, Tensor(), w, fdy, fx, fw, &saved, ops::GradWrite::Accumulate);
  EXPECT_TRUE(identical(dx2, dx));
  EXPECT_TRUE(identical(dw2, dw));
  EXPECT_TRUE(identical(db2, db));
  ops::Fp8Saved wrong{.x = saved.x, .w = Tensor::zeros({in, out})};
  const std::string err = testing::error_of(
      [&] {
        ops::fp8_linear_bwd(&dx2, dw2, nullptr, dy, Tensor(), w, fdy, fx, fw, &wrong, ops::GradWrite::Accumulate);
      });
  EXPECT_NE(err.find("saved w must be the forward's q(w)"), std::string::npos) << err;
}

// Fp8Act: the GELU in the input's cast and gelu' in the gradient's cast give what the unfused ops give (gelu_fwd /
// gelu_bwd written out, then the plain FP8 linear): y, the casts' amax, dx, dw and db, bit for bit.
TEST(Fp8Linear, ActivationInTheCastIsTheUnfusedOps) {
  const int64_t n = 48, in = 32, out = 24;
  Tensor pre = testing::random_tensor({n, in}, 21, nullptr, -3.0, 3.0);  // fc2's input before its GELU
  Tensor w = testing::random_tensor({out, in}, 22, nullptr, -0.1, 0.1);
  Tensor act = Tensor::empty({n, in});
  ops::gelu_fwd(act, pre);
  auto operand = [](float s) { return ops::Fp8Operand{.scale = scale_of(s), .amax = Tensor::zeros({1})}; };
  ops::Fp8Operand fx = operand(448.0f / 3.0f), fx_gelu = operand(448.0f / 3.0f);
  fx_gelu.act = ops::Fp8Act::Gelu;
  Tensor y = Tensor::empty({n, out}), y_fused = Tensor::empty({n, out});
  ops::Fp8Saved saved, saved_fused;
  ops::fp8_linear_fwd(y, act, w, nullptr, fx, operand(4480.0f), &saved);
  ops::fp8_linear_fwd(y_fused, pre, w, nullptr, fx_gelu, operand(4480.0f), &saved_fused);
  EXPECT_TRUE(identical(y_fused, y));
  EXPECT_TRUE(identical(saved_fused.x, saved.x));
  EXPECT_EQ(fx_gelu.amax.data<float>()[0], fx.amax.data<float>()[0]);
  Tensor y_pre = Tensor::empty({n, out});
  ops::fp8_linear_fwd(y_pre, pre, w, nullptr, fx, operand(4480.0f), nullptr);
  EXPECT_FALSE(identical(y_pre, y)) << "the activation is applied";

  // the backward of a linear whose output feeds a GELU: its dy is dact * gelu'(pre_out)
  Tensor x = testing::random_tensor({n, in}, 23, nullptr, -2.0, 2.0);
  Tensor dact = testing::random_tensor({n, out}, 24, nullptr, -1e-3, 1e-3);
  Tensor pre_out = testing::random_tensor({n, out}, 25, nullptr, -3.0, 3.0);
  Tensor dpre = Tensor::empty({n, out});
  ops::gelu_bwd(dpre, dact, pre_out);
  ops::Fp8Operand fdy = operand(57344.0f / 1e-3f), fdy_gelu = operand(57344.0f / 1e-3f);
  fdy.format = fdy_gelu.format = Fp8Format::E5M2;
  fdy_gelu.act = ops::Fp8Act::DGelu;
  fdy_gelu.act_input = pre_out;
  const ops::Fp8Operand fxb = operand(448.0f / 2.0f), fw = operand(4480.0f);
  Tensor dx = Tensor::empty({n, in}), dw = testing::random_tensor({out, in}, 26), db = Tensor::zeros({out});
  Tensor dx2 = Tensor::empty({n, in}), dw2 = dw.clone(), db2 = db.clone();
  ops::fp8_linear_bwd(&dx, dw, &db, dpre, x, w, fdy, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  ops::fp8_linear_bwd(&dx2, dw2, &db2, dact, x, w, fdy_gelu, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  EXPECT_TRUE(identical(dx2, dx));
  EXPECT_TRUE(identical(dw2, dw));
  EXPECT_TRUE(identical(db2, db));
  EXPECT_EQ(fdy_gelu.amax.data<float>()[0], fdy.amax.data<float>()[0]);

  fdy_gelu.act_input = Tensor::zeros({n, in});
  const std::string err = testing::error_of([&] {
    ops::fp8_linear_bwd(&dx2, dw2, nullptr, dact, x, w, fdy_gelu, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  });
  EXPECT_NE(err.find("act_input must have the gradient's"), std::string::npos) << err;
}

// Fp8Act::Swiglu / DSwiglu: swiglu in the input's cast (x [n, 2 in] = [gate | up]) and swiglu_bwd in the gradient's
// cast (dy [n, out / 2], the pre-activation [n, out]) give what swiglu_fwd / swiglu_bwd written out, then the plain FP8
// linear give: y, the saved cast, the amax, dx, dw and db, bit for bit.
TEST(Fp8Linear, SwigluInTheCastIsTheUnfusedOps) {
  const int64_t n = 48, in = 32, out = 48;
  const Tensor pre = testing::random_tensor({n, 2 * in}, 41, nullptr, -3.0, 3.0);  // fc2's input before its SwiGLU
  const Tensor w = testing::random_tensor({out, in}, 42, nullptr, -0.1, 0.1);
  Tensor act = Tensor::empty({n, in});
  ops::swiglu_fwd(act, pre);
  auto operand = [](float s) { return ops::Fp8Operand{.scale = scale_of(s), .amax = Tensor::zeros({1})}; };
  ops::Fp8Operand fx = operand(448.0f / 8.0f), fx_swiglu = operand(448.0f / 8.0f);
  fx_swiglu.act = ops::Fp8Act::Swiglu;
  Tensor y = Tensor::empty({n, out}), y_fused = Tensor::empty({n, out});
  ops::Fp8Saved saved, saved_fused;
  ops::fp8_linear_fwd(y, act, w, nullptr, fx, operand(4480.0f), &saved);
  ops::fp8_linear_fwd(y_fused, pre, w, nullptr, fx_swiglu, operand(4480.0f), &saved_fused);
  EXPECT_TRUE(identical(y_fused, y));
  EXPECT_TRUE(identical(saved_fused.x, saved.x));
  EXPECT_EQ(fx_swiglu.amax.data<float>()[0], fx.amax.data<float>()[0]);

  // the backward of a linear whose output [n, out] feeds a SwiGLU: its dy is swiglu_bwd(dact [n, out / 2], pre_out)
  const Tensor x = testing::random_tensor({n, in}, 43, nullptr, -2.0, 2.0);
  const Tensor dact = testing::random_tensor({n, out / 2}, 44, nullptr, -1e-3, 1e-3);
  const Tensor pre_out = testing::random_tensor({n, out}, 45, nullptr, -3.0, 3.0);
  Tensor dpre = Tensor::empty({n, out});
  ops::swiglu_bwd(dpre, dact, pre_out);
  ops::Fp8Operand fdy = operand(57344.0f / 1e-2f), fdy_swiglu = operand(57344.0f / 1e-2f);
  fdy.format = fdy_swiglu.format = Fp8Format::E5M2;
  fdy_swiglu.act = ops::Fp8Act::DSwiglu;
  fdy_swiglu.act_input = pre_out;
  const ops::Fp8Operand fxb = operand(448.0f / 2.0f), fw = operand(4480.0f);
  Tensor dx = Tensor::empty({n, in}), dw = testing::random_tensor({out, in}, 46), db = Tensor::zeros({out});
  Tensor dx2 = Tensor::empty({n, in}), dw2 = dw.clone(), db2 = db.clone();
  ops::fp8_linear_bwd(&dx, dw, &db, dpre, x, w, fdy, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  ops::fp8_linear_bwd(&dx2, dw2, &db2, dact, x, w, fdy_swiglu, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  EXPECT_TRUE(identical(dx2, dx));
  EXPECT_TRUE(identical(dw2, dw));
  EXPECT_TRUE(identical(db2, db));
  EXPECT_EQ(fdy_swiglu.amax.data<float>()[0], fdy.amax.data<float>()[0]);
  EXPECT_GT(fdy.amax.data<float>()[0], 0.0f);

  fdy_swiglu.act_input = Tensor::zeros({n, out / 2});
  const std::string err = testing::error_of([&] {
    ops::fp8_linear_bwd(&dx2, dw2, nullptr, dact, x, w, fdy_swiglu, fxb, fw, nullptr, ops::GradWrite::Accumulate);
  });
  EXPECT_NE(err.find("act_input must have twice"), std::string::npos) << err;
}

// Fp8Act::Norm: a LayerNorm / RMSNorm in the input's cast, from the statistics the norm's forward wrote without its
// output (an undefined y), gives what the norm written out, then the plain FP8 linear gives: y, the saved cast and the
// amax, bit for bit (both from a plain and from a fused add + norm forward). A malformed norm is a named error.
TEST(Fp8Linear, NormInTheCastIsTheNormThenTheLinear) {
  const int64_t n = 40, h = 32, out = 24;
  const Tensor a = testing::random_tensor({n, h}, 31, nullptr, -2.0, 2.0), b = testing::random_tensor({n, h}, 32);
  const Tensor gamma = testing::random_tensor({h}, 33, nullptr, 0.5, 1.5), beta = testing::random_tensor({h}, 34);
  const Tensor w = testing::random_tensor({out, h}, 35, nullptr, -0.1, 0.1);
  auto operand = [](float s) { return ops::Fp8Operand{.scale = scale_of(s), .amax = Tensor::zeros({1})}; };
  for (const bool layernorm : {true, false})
    for (const bool add : {false, true}) {
      SCOPED_TRACE(std::string(layernorm ? "LayerNorm" : "RMSNorm") + (add ? ", fused add" : ""));
      Tensor x = add ? Tensor::empty({n, h}) : a, ln = Tensor::empty({n, h}), none;
      Tensor mean = Tensor::empty({n}), rstd = Tensor::empty({n}), mean2 = Tensor::empty({n}),
             rstd2 = Tensor::empty({n});
      testing::norm_forward(layernorm, add, x, ln, mean, rstd, a, b, gamma, beta, 1e-5f);
      testing::norm_forward(layernorm, add, x, none, mean2, rstd2, a, b, gamma, beta, 1e-5f);  // statistics only
      EXPECT_TRUE(identical(rstd2, rstd)) << "the statistics without the output";
      if (layernorm) EXPECT_TRUE(identical(mean2, mean));
      ops::Fp8Operand fx = operand(448.0f / 4.0f), fx_norm = operand(448.0f / 4.0f);
      fx_norm.act = ops::Fp8Act::Norm;
      fx_norm.norm = {.mean = layernorm ? mean2 : Tensor(), .rstd = rstd2, .weight = gamma,
                      .bias = layernorm ? beta : Tensor(), .eps = 1e-5f};
      Tensor y = Tensor::empty({n, out}), y_fused = Tensor::empty({n, out});
      ops::Fp8Saved saved, saved_fused;
      ops::fp8_linear_fwd(y, ln, w, nullptr, fx, operand(4480.0f), &saved);
      ops::fp8_linear_fwd(y_fused, x, w, nullptr, fx_norm, operand(4480.0f), &saved_fused);
      EXPECT_TRUE(identical(y_fused, y));
      EXPECT_TRUE(identical(saved_fused.x, saved.x));
      EXPECT_EQ(fx_norm.amax.data<float>()[0], fx.amax.data<float>()[0]);
      Tensor y_raw = Tensor::empty({n, out});
      ops::fp8_linear_fwd(y_raw, x, w, nullptr, fx, operand(4480.0f), nullptr);
      EXPECT_FALSE(identical(y_raw, y)) << "the norm is applied";
    }
  ops::Fp8Operand bad = operand(1.0f);
  bad.act = ops::Fp8Act::Norm;
  bad.norm = {.mean = Tensor::zeros({n}), .rstd = Tensor::zeros({n}), .weight = gamma};  // a mean without a bias
  Tensor y = Tensor::empty({n, out});
  const std::string err =
      testing::error_of([&] { ops::fp8_linear_fwd(y, a, w, nullptr, bad, operand(1.0f), nullptr); });
  EXPECT_NE(err.find("the Norm operand needs rstd and weight"), std::string::npos) << err;
}

}  // namespace
}  // namespace mcpp
