// CUDA mla_qkv_fwd / mla_qkv_bwd against the CPU backend (float32: fp32 rounding; bf16: one rounding of each output),
// values-padded and queries / keys-padded shapes; copy_columns bitwise (fp32, bf16).
#include <cstring>

#include "cuda/cuda_test_util.h"

namespace mcpp::cuda_test {
namespace {

TEST(CudaMla, QkvForwardAndBackwardMatchCpu) {
  MCPP_REQUIRE_CUDA();
  struct D {
    int64_t n, dn, dr, dv, c;
  };
  const int64_t s = 9, b = 3;
  for (DType dt : float_dtypes())
    for (const D& d : {D{4, 48, 16, 32, 48}, D{2, 32, 16, 64, 40}, D{3, 6, 4, 5, 11}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << d.n << " dn=" << d.dn << " dr=" << d.dr
                                        << " dv=" << d.dv);
      const int64_t dc = std::max(d.dn + d.dr, d.dv), half = d.dr / 2;
      Tensor q = rnd({s, b, d.n, d.dn + d.dr}, 1, dt), kv = rnd({s, b, d.n, d.dn + d.dv}, 2, dt),
             lat = rnd({s, b, d.c}, 3, dt), cosv = rnd({s, half}, 4), sinv = rnd({s, half}, 5);
      Tensor rq = Tensor::empty({s, b, d.n, dc}), rk = Tensor::empty({s, b, d.n, dc}), rv = Tensor::empty({s, b, d.n, dc});
      ops::cpu::mla_qkv_fwd(rq, rk, rv, q, kv, lat, cosv, sinv, {});
      Tensor gq = poisoned(rq.shape(), dt), gk = poisoned(rk.shape(), dt), gv = poisoned(rv.shape(), dt);
      ops::mla_qkv_fwd(gq, gk, gv, dev(q, dt), dev(kv, dt), dev(lat, dt), dev(cosv), dev(sinv));
      EXPECT_REL(host(gq), rq, tol(dt, 1e-6, 1e-2));
      EXPECT_REL(host(gk), rk, tol(dt, 1e-6, 1e-2));
      EXPECT_EQ(rel_err(host(gv), rv), 0.0);  // a copy (and zeros)
      Tensor dquery = rnd(rq.shape(), 6, dt), dkey = rnd(rk.shape(), 7, dt), dvalue = rnd(rv.shape(), 8, dt);
      Tensor wq = Tensor::empty(q.shape()), wkv = Tensor::empty(kv.shape()), wpe = Tensor::empty({s, b, d.dr});
      ops::cpu::mla_qkv_bwd(wq, wkv, wpe, dquery, dkey, dvalue, cosv, sinv, {});
      Tensor hq = poisoned(q.shape(), dt), hkv = poisoned(kv.shape(), dt), hpe = poisoned({s, b, d.dr}, dt);
      ops::mla_qkv_bwd(hq, hkv, hpe, dev(dquery, dt), dev(dkey, dt), dev(dvalue, dt), dev(cosv), dev(sinv));
      EXPECT_REL(host(hq), wq, tol(dt, 1e-6, 1e-2));
      EXPECT_EQ(rel_err(host(hkv), wkv), 0.0);
      EXPECT_REL(host(hpe), wpe, tol(dt, 1e-6, 1e-2));
    }
}

TEST(CudaCopyColumns, MatchesCpuExactly) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : float_dtypes()) {
    Tensor x = rnd({5, 3, 24}, 9, dt), y0 = rnd({15, 40}, 10, dt);
    Tensor want = y0.to(dt);
    ops::cpu::copy_columns(want, x.to(dt), 7, 5, 17, {});
    Tensor got = dev(y0, dt);
    ops::copy_columns(got, dev(x, dt), 7, 5, 17);
    const Tensor g = host(got);  // (fp32 view of the result)
    EXPECT_EQ(rel_err(g, want.to(DType::F32)), 0.0) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace mcpp::cuda_test
