// CUDA elementwise ops, cast, activations, dropout, RoPE and embedding vs the CPU backend.
#include "cuda/cuda_test_util.h"
#include "mcpp/kernels/deterministic_kernels.h"

namespace mcpp {
namespace {
using namespace cuda_test;

TEST(CudaElementwise, AddScaleAddInplace) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = rnd({1001}, 1, dt), b = rnd({1001}, 2, dt);
    Tensor want = Tensor::empty({1001});
    ops::cpu::add(want, a, b, {});
    ops::cpu::scale_inplace(want, 0.75f, {});
    ops::cpu::add_inplace(want, a, {});
    Tensor out = poisoned({1001}, dt);
    Tensor ad = dev(a, dt);
    ops::add(out, ad, dev(b, dt));
    ops::scale_inplace(out, 0.75f);
    ops::add_inplace(out, ad);
    // fp32: identical operations, bit-for-bit up to FMA contraction; bf16: three roundings of the output
    EXPECT_REL(host(out), want, tol(dt, 1e-7, 1e-2));
  }
}

TEST(CudaElementwise, CastRoundsLikeTheCpu) {
  MCPP_REQUIRE_CUDA();
  Tensor x = rnd({4099}, 3, DType::F32, -300.0, 300.0);
  for (DType to : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(to));
    Tensor want = Tensor::empty({4099}, to);
    ops::cpu::cast(want, x, {});
    Tensor got = poisoned({4099}, to);
    ops::cast(got, dev(x));
    Tensor g = got.to(Device::CPU);
    EXPECT_EQ(std::memcmp(g.raw(), want.raw(), want.nbytes()), 0);  // round-to-nearest-even both sides: exact
    Tensor back = poisoned({4099}, DType::F32);
    ops::cast(back, got);
    Tensor want_back = Tensor::empty({4099});
    ops::cpu::cast(want_back, want, {});
    EXPECT_EQ(std::memcmp(back.to(Device::CPU).raw(), want_back.raw(), want_back.nbytes()), 0);  // widening: exact
  }
}

TEST(CudaActivations, GeluSwigluForwardBackward) {
  MCPP_REQUIRE_CUDA();
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = rnd({33, 70}, 4, dt, -4, 4), dy = rnd({33, 70}, 5, dt);
    Tensor y_ref = Tensor::empty({33, 70}), dx_ref = Tensor::empty({33, 70});
    ops::cpu::gelu_fwd(y_ref, x, {});
    ops::cpu::gelu_bwd(dx_ref, dy, x, {});
    Tensor y = poisoned({33, 70}, dt), dx = poisoned({33, 70}, dt);
    Tensor xd = dev(x, dt);
    ops::gelu_fwd(y, xd);
    ops::gelu_bwd(dx, dev(dy, dt), xd);
    // fp32: tanhf / expf vs the CPU's double math, ~1e-7 per element
    EXPECT_REL(host(y), y_ref, tol(dt, 1e-6));
    EXPECT_REL(host(dx), dx_ref, tol(dt, 1e-6));

    Tensor sy_ref = Tensor::empty({33, 35}), sdx_ref = Tensor::empty({33, 70}), sdy = rnd({33, 35}, 6, dt);
    ops::cpu::swiglu_fwd(sy_ref, x, {});
    ops::cpu::swiglu_bwd(sdx_ref, sdy, x, {});
    Tensor sy = poisoned({33, 35}, dt), sdx = poisoned({33, 70}, dt);
    ops::swiglu_fwd(sy, xd);
    ops::swiglu_bwd(sdx, dev(sdy, dt), xd);
    EXPECT_REL(host(sy), sy_ref, tol(dt, 1e-6));
    EXPECT_REL(host(sdx), sdx_ref, tol(dt, 1e-6));
  }
}

// n = 1001: the scalar kernel (the last Philox group partial); n = 4096: the 8-wide kernel (16-byte accesses).
TEST(CudaDropout, MaskEqualsCpuBitForBit) {
  MCPP_REQUIRE_CUDA();
  const PhiloxKey key{.seed = 0x1234567890abcdefull, .offset = 7};
  for (int64_t n : {1001, 4096}) {
    Tensor x = rnd({n}, 7);
    for (float p : {0.0f, 0.1f, 0.5f, 1.0f}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " p=" << p);
      Tensor want = Tensor::empty({n}), got = poisoned({n}, DType::F32);
      ops::cpu::dropout_fwd(want, x, p, key, {});
      ops::dropout_fwd(got, dev(x), p, key);
      EXPECT_EQ(std::memcmp(got.to(Device::CPU).raw(), want.raw(), want.nbytes()), 0);  // same mask, same x * scale
      Tensor dwant = Tensor::empty({n}), dgot = poisoned({n}, DType::F32);
      ops::cpu::dropout_bwd(dwant, x, p, key, {});
      ops::dropout_bwd(dgot, dev(x), p, key);
      EXPECT_EQ(std::memcmp(dgot.to(Device::CPU).raw(), dwant.raw(), dwant.nbytes()), 0);
    }
    // bf16: the same mask (zeros in the same places), values rounded once.
    Tensor xb = rnd({n}, 8, DType::BF16), want = Tensor::empty({n}), got = poisoned({n}, DType::BF16);
    ops::cpu::dropout_fwd(want, xb, 0.3f, key, {});
    ops::dropout_fwd(got, dev(xb, DType::BF16), 0.3f, key);
    Tensor g = host(got);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(g.data<float>()[i] == 0.0f, want.data<float>()[i] == 0.0f) << i;
    EXPECT_REL(g, want, 4e-3);
  }
}

// A CUDA-graph key (offset relative to a device base, core/rng.h) draws the mask of the absolute offset
// base + offset, read when the kernel runs: changing the base between launches changes the mask.
TEST(CudaDropout, DeviceBaseKeyEqualsTheAbsoluteOffset) {
  MCPP_REQUIRE_CUDA();
  for (int64_t n : {1001, 1024}) {  // the scalar and the 8-wide kernel
    Tensor x = rnd({n}, 9);
    Tensor base = Tensor::empty({1}, DType::I64);
    for (int64_t b : {int64_t{0}, int64_t{5}, int64_t{1} << 40}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " base=" << b);
      base.data<int64_t>()[0] = b;
      Tensor base_d = base.to(Device::CUDA);
      const PhiloxKey rel{.seed = 99, .offset = 3, .device_base = static_cast<const uint64_t*>(base_d.raw())};
      const PhiloxKey abs{.seed = 99, .offset = 3 + static_cast<uint64_t>(b)};
      Tensor want = Tensor::empty({n}), got = poisoned({n}, DType::F32);
      ops::cpu::dropout_fwd(want, x, 0.4f, abs, {});
      ops::dropout_fwd(got, dev(x), 0.4f, rel);
      EXPECT_EQ(std::memcmp(got.to(Device::CPU).raw(), want.raw(), want.nbytes()), 0);
    }
  }
}

// random_scale bitwise the CPU's (float32; bf16 rounded once); random_normal the CPU's numbers (float64 log / cos on
// both sides: equal float32 unless a result falls on a rounding boundary), bf16 rounded; a device-base key.
TEST(CudaRandom, NormalAndScaleEqualCpu) {
  MCPP_REQUIRE_CUDA();
  const PhiloxKey key{.seed = 0xfeedbeefull, .offset = 13};
  for (int64_t n : {1, 1001, 65536}) {
    SCOPED_TRACE(n);
    Tensor want = Tensor::empty({n}), got = poisoned({n}, DType::F32);
    ops::cpu::random_normal(want, key, {});
    ops::random_normal(got, key);
    Tensor g = host(got);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      differ += g.data<float>()[i] != want.data<float>()[i];
      ASSERT_NEAR(g.data<float>()[i], want.data<float>()[i], 1e-6 * (1.0 + std::abs(want.data<float>()[i])));
    }
    EXPECT_LE(differ, 2) << "random_normal differs from the CPU in " << differ << " of " << n;
    Tensor gb = poisoned({n}, DType::BF16);
    ops::random_normal(gb, key);
    EXPECT_REL(host(gb), want, 4e-3);
    Tensor x = rnd({n}, 5), ys = Tensor::empty({n}), yg = poisoned({n}, DType::F32);
    ops::cpu::random_scale(ys, x, 0.9f, 1.1f, key, {});
    ops::random_scale(yg, dev(x), 0.9f, 1.1f, key);
    EXPECT_EQ(std::memcmp(yg.to(Device::CPU).raw(), ys.raw(), ys.nbytes()), 0);
    Tensor xb = rnd({n}, 6, DType::BF16), yb = dev(xb, DType::BF16);
    ops::cpu::random_scale(ys, xb, 0.9f, 1.1f, key, {});
    ops::random_scale(yb, yb, 0.9f, 1.1f, key);  // in place
    EXPECT_REL(host(yb), ys, 4e-3);
  }
  Tensor base = Tensor::empty({1}, DType::I64);
  base.data<int64_t>()[0] = 40;
  Tensor base_d = base.to(Device::CUDA);
  const PhiloxKey rel{.seed = 5, .offset = 2, .device_base = static_cast<const uint64_t*>(base_d.raw())};
  Tensor want = Tensor::empty({999}), got = poisoned({999}, DType::F32);
  ops::cpu::random_normal(want, PhiloxKey{.seed = 5, .offset = 42}, {});
  ops::random_normal(got, rel);
  EXPECT_REL(host(got), want, 1e-6);
  Tensor x = rnd({999}, 7), ys = Tensor::empty({999}), yg = poisoned({999}, DType::F32);
  ops::cpu::random_scale(ys, x, 0.5f, 1.5f, PhiloxKey{.seed = 5, .offset = 42}, {});
  ops::random_scale(yg, dev(x), 0.5f, 1.5f, rel);
  EXPECT_EQ(std::memcmp(yg.to(Device::CPU).raw(), ys.raw(), ys.nbytes()), 0);
}

// Vector path (half % 8 == 0): rot = 48 < d = 64 (dims 48..63 pass through) and the full rotation of d = 128;
// per-pair path: half = 20.
TEST(CudaRope, ForwardBackwardPartialRotaryAndInPlace) {
  MCPP_REQUIRE_CUDA();
  const int64_t s = 7, b = 3, heads = 4;
  for (const auto& [d, half] : std::vector<std::pair<int64_t, int64_t>>{{64, 24}, {128, 64}, {64, 20}}) {
    Tensor cosv = rnd({s, half}, 9), sinv = rnd({s, half}, 10);
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " d=" << d << " half=" << half);
      Tensor x = rnd({s, b, heads, d}, 11, dt);
      Tensor y_ref = Tensor::empty(x.shape()), dx_ref = Tensor::empty(x.shape());
      ops::cpu::rope_fwd(y_ref, x, cosv, sinv, {});
      ops::cpu::rope_bwd(dx_ref, x, cosv, sinv, {});
      Tensor y = poisoned(x.shape(), dt), c = dev(cosv), sn = dev(sinv);
      ops::rope_fwd(y, dev(x, dt), c, sn);
      EXPECT_REL(host(y), y_ref, tol(dt, 1e-6));  // one fp32 FMA pair per element
      Tensor inplace = dev(x, dt);
      ops::rope_bwd(inplace, inplace, c, sn);  // y may alias x
      EXPECT_REL(host(inplace), dx_ref, tol(dt, 1e-6));
    }
  }
}

TEST(CudaEmbedding, VocabPartitionForwardAndAccumulatingBackward) {
  MCPP_REQUIRE_CUDA();
  const int64_t v = 50, h = 72, vocab_start = 10;
  Tensor ids = Tensor::empty({6, 5}, DType::I32);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int32_t>()[i] = static_cast<int32_t>((i * 7) % 70);  // some out
  ids.data<int32_t>()[3] = ids.data<int32_t>()[4] = 25;  // repeated id: backward must add both rows
  Tensor idsd = ids.to(Device::CUDA);
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor table = rnd({v, h}, 12, dt);
    Tensor out_ref = Tensor::empty({6, 5, h});
    ops::cpu::embedding_fwd(out_ref, ids, table, vocab_start, {});
    Tensor out = poisoned({6, 5, h}, dt);
    ops::embedding_fwd(out, idsd, dev(table, dt), vocab_start);
    EXPECT_EQ(rel_err(host(out), out_ref), 0.0);  // a copy: exact
    Tensor dout = rnd({6, 5, h}, 13, dt), dt_ref = rnd({v, h}, 14);
    Tensor dtab = dev(dt_ref);
    ops::cpu::embedding_bwd(dt_ref, ids, dout, vocab_start, {});
    ops::embedding_bwd(dtab, idsd, dev(dout, dt), vocab_start);
    EXPECT_REL(host(dtab), dt_ref, 1e-6);  // fp32 adds in another order (atomics)
  }
}

// The ordered backward (ops::cuda::set_deterministic_kernels, --deterministic-mode) adds each row's tokens in
// position order, as the CPU backend does: the result equals the CPU's bit for bit. Shapes: more rows than
// the 1024 owner blocks (owners wrap), ids outside the partition, hot ids repeated hundreds of times, n not
// a multiple of the 1024-token chunk; accumulating onto a non-zero table.
TEST(CudaEmbedding, OrderedBackwardEqualsCpuBitForBit) {
  MCPP_REQUIRE_CUDA();
  const bool prev = ops::cuda::deterministic_kernels();
  ops::cuda::set_deterministic_kernels(true);
  for (const int64_t v : {int64_t{37}, int64_t{2500}}) {
    const int64_t n = 3001, h = 72, vocab_start = 5;
    Tensor ids = Tensor::empty({n}, DType::I32);
    for (int64_t i = 0; i < n; ++i)
      ids.data<int32_t>()[i] = static_cast<int32_t>(i % 3 == 0 ? 9 : (i * 7919) % (v + 20));  // id 9: hot
    Tensor idsd = ids.to(Device::CUDA);
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " v=" << v);
      Tensor dout = rnd({n, h}, 15, dt), dt_ref = rnd({v, h}, 16);
      Tensor dtab = dev(dt_ref);
      ops::cpu::embedding_bwd(dt_ref, ids, dout, vocab_start, {});
      ops::embedding_bwd(dtab, idsd, dev(dout, dt), vocab_start);
      EXPECT_EQ(std::memcmp(dtab.to(Device::CPU).raw(), dt_ref.raw(), dt_ref.nbytes()), 0);
    }
  }
  ops::cuda::set_deterministic_kernels(prev);
}

}  // namespace
}  // namespace mcpp
