// Multi-latent attention's ops on the CPU backend (ops.inc mla_qkv_fwd / mla_qkv_bwd, copy_columns): the forward
// against an element-by-element transcription of the formula (Megatron's MLA channel order: evens then odds, then
// rotate_half), zero padding included; the backward as the forward's adjoint (<F x, y> == <x, F^T y> in float64,
// the forward being linear in q, kv and the latent's rotary channels); copy_columns bitwise, and argument errors
// that name the op.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

struct Dims {
  int64_t s, b, n, dn, dr, dv, c;
  int64_t dc() const { return std::max(dn + dr, dv); }
};

double dot(const Tensor& a, const Tensor& b) {
  double r = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) r += static_cast<double>(a.data<float>()[i]) * b.data<float>()[i];
  return r;
}

void check(const Dims& d) {
  SCOPED_TRACE(::testing::Message() << "dn=" << d.dn << " dr=" << d.dr << " dv=" << d.dv << " c=" << d.c);
  const int64_t half = d.dr / 2, dc = d.dc();
  Tensor q = testing::random_tensor({d.s, d.b, d.n, d.dn + d.dr}, 1);
  Tensor kv = testing::random_tensor({d.s, d.b, d.n, d.dn + d.dv}, 2);
  Tensor lat = testing::random_tensor({d.s, d.b, d.c}, 3);
  Tensor cos = testing::random_tensor({d.s, half}, 4), sin = testing::random_tensor({d.s, half}, 5);
  Tensor query = Tensor::empty({d.s, d.b, d.n, dc}), key = Tensor::empty({d.s, d.b, d.n, dc}),
         value = Tensor::empty({d.s, d.b, d.n, dc});
  ops::mla_qkv_fwd(query, key, value, q, kv, lat, cos, sin);
  // The formula, element by element.
  const auto at = [](const Tensor& t, int64_t i) { return static_cast<double>(t.data<float>()[i]); };
  for (int64_t t = 0; t < d.s * d.b; ++t) {
    const int64_t p = t / d.b;
    const auto rot = [&](const Tensor& x, int64_t base, int64_t j) {  // rotary output channel j of the row at base
      const double c = at(cos, p * half + j % half), sn = at(sin, p * half + j % half);
      const int64_t k = j % half;
      return j < half ? at(x, base + 2 * k) * c - at(x, base + 2 * k + 1) * sn
                      : at(x, base + 2 * k + 1) * c + at(x, base + 2 * k) * sn;
    };
    for (int64_t h = 0; h < d.n; ++h) {
      const int64_t row = t * d.n + h, o = row * dc;
      for (int64_t j = 0; j < dc; ++j) {
        const double wq = j < d.dn ? at(q, row * (d.dn + d.dr) + j)
                          : j < d.dn + d.dr ? rot(q, row * (d.dn + d.dr) + d.dn, j - d.dn) : 0.0;
        const double wk = j < d.dn ? at(kv, row * (d.dn + d.dv) + j)
                          : j < d.dn + d.dr ? rot(lat, t * d.c + d.c - d.dr, j - d.dn) : 0.0;
        const double wv = j < d.dv ? at(kv, row * (d.dn + d.dv) + d.dn + j) : 0.0;
        ASSERT_NEAR(at(query, o + j), wq, 1e-6) << "query t=" << t << " h=" << h << " j=" << j;
        ASSERT_NEAR(at(key, o + j), wk, 1e-6) << "key t=" << t << " h=" << h << " j=" << j;
        ASSERT_EQ(at(value, o + j), wv) << "value t=" << t << " h=" << h << " j=" << j;
      }
    }
  }
  // The backward is the adjoint: <fwd(q, kv, lat), (gq, gk, gv)> == <q, dq> + <kv, dkv> + <k_pe, dk_pe>
  // (the latent's first c - dr channels do not enter the forward).
  Tensor gq = testing::random_tensor(query.shape(), 6), gk = testing::random_tensor(key.shape(), 7),
         gv = testing::random_tensor(value.shape(), 8);
  Tensor dq = Tensor::empty(q.shape()), dkv = Tensor::empty(kv.shape()), dpe = Tensor::empty({d.s, d.b, d.dr});
  ops::mla_qkv_bwd(dq, dkv, dpe, gq, gk, gv, cos, sin);
  Tensor pe = Tensor::empty({d.s, d.b, d.dr});
  ops::copy_columns(pe, lat, 0, d.c - d.dr, d.dr);
  const double lhs = dot(query, gq) + dot(key, gk) + dot(value, gv);
  const double rhs = dot(q, dq) + dot(kv, dkv) + dot(pe, dpe);
  EXPECT_NEAR(lhs, rhs, 1e-5 * (std::abs(lhs) + 1.0));
}

TEST(MlaQkv, ForwardIsTheFormulaBackwardItsAdjoint) {
  check({.s = 5, .b = 2, .n = 3, .dn = 6, .dr = 4, .dv = 5, .c = 11});   // values padded (dc = dn + dr = 10)
  check({.s = 4, .b = 3, .n = 2, .dn = 2, .dr = 8, .dv = 16, .c = 8});   // queries / keys padded (dc = dv)
  check({.s = 3, .b = 1, .n = 4, .dn = 8, .dr = 8, .dv = 16, .c = 24});  // no padding
  check({.s = 64, .b = 8, .n = 8, .dn = 16, .dr = 16, .dv = 8, .c = 24});  // above the OpenMP threshold (threads)
}

TEST(MlaQkv, BadShapesNameTheOp) {
  Tensor q = Tensor::zeros({2, 1, 2, 6}), kv = Tensor::zeros({2, 1, 2, 7}), lat = Tensor::zeros({2, 1, 5});
  Tensor cos = Tensor::zeros({2, 2}), sin = Tensor::zeros({2, 2});
  Tensor out = Tensor::zeros({2, 1, 2, 6});
  Tensor o2 = Tensor::zeros({2, 1, 2, 6}), o3 = Tensor::zeros({2, 1, 2, 6});
  ops::mla_qkv_fwd(out, o2, o3, q, kv, lat, cos, sin);  // dn 2, dr 4, dv 5, dc 6: fits
  Tensor small = Tensor::zeros({2, 1, 2, 5});
  try {
    ops::mla_qkv_fwd(small, o2, o3, q, kv, lat, cos, sin);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mla_qkv_fwd"), std::string::npos) << e.what();
  }
  Tensor short_lat = Tensor::zeros({2, 1, 3});  // fewer channels than dr
  EXPECT_THROW(ops::mla_qkv_fwd(out, o2, o3, q, kv, short_lat, cos, sin), Error);
  Tensor bf = Tensor::zeros({2, 1, 2, 6}, DType::BF16);
  EXPECT_THROW(ops::mla_qkv_fwd(out, o2, o3, bf, kv, lat, cos, sin), Error);  // dtypes differ
  Tensor dpe = Tensor::zeros({2, 1, 3});  // not [s, b, dr]
  EXPECT_THROW(ops::mla_qkv_bwd(q, kv, dpe, out, o2, o3, cos, sin), Error);
}

TEST(CopyColumns, CopiesTheBlockAndLeavesTheRest) {
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor x = testing::random_tensor({3, 2, 7}, 9).to(dt);
    Tensor y = Tensor::zeros({6, 5}, dt);
    ops::copy_columns(y, x, 1, 3, 4);  // x's columns 3..6 into y's 1..4
    const auto e = static_cast<int64_t>(dtype_size(dt));
    for (int64_t r = 0; r < 6; ++r) {
      EXPECT_EQ(std::memcmp(static_cast<const char*>(y.raw()) + (r * 5 + 1) * e,
                            static_cast<const char*>(x.raw()) + (r * 7 + 3) * e, static_cast<size_t>(4 * e)),
                0);
      const Tensor f = y.to(DType::F32);
      EXPECT_EQ(f.data<float>()[r * 5], 0.0f);
    }
  }
  Tensor x = Tensor::zeros({4, 3}), y = Tensor::zeros({4, 2});
  EXPECT_THROW(ops::copy_columns(y, x, 0, 2, 2), Error);  // past x's columns
  EXPECT_THROW(ops::copy_columns(y, x, 1, 0, 2), Error);  // past y's columns
  Tensor rows = Tensor::zeros({5, 2});
  EXPECT_THROW(ops::copy_columns(rows, x, 0, 0, 2), Error);  // rows differ
  Tensor bf = Tensor::zeros({4, 2}, DType::BF16);
  EXPECT_THROW(ops::copy_columns(bf, x, 0, 0, 2), Error);  // dtypes differ
}

}  // namespace
}  // namespace mcpp
