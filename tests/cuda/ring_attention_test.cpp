// The ring attention's steps (--cp-comm-type p2p) on the CUDA backend: a simulated CP group (ring_sim.h) on one
// GPU equals one causal attention over the whole sequence on the CPU (float32 and bf16; cuDNN's fused attention
// and the mcpp kernels; head dims 32 / 64 / 96 / 128 / 256; GQA; cp 2 and 3; attention dropout: the CPU's mask, blocks on and off the 4-key Philox
// counters), and ops::attention_merge matches the CPU's, -inf rows included. The
// messages between GPUs are the NCCL backend's batch_p2p, tested by the NCCL driver; two GPUs run the whole
// ring in tests/device/gpu_parallel_check.sh.
#include <limits>

#include "cuda/cuda_test_util.h"
#include "transformer/ring_sim.h"

namespace mcpp {
namespace {
using namespace cuda_test;

TEST(CudaRingAttention, StepsMatchOneCpuAttention) {
  MCPP_REQUIRE_CUDA();
  struct Case {
    int cp;
    int64_t c, b, nq, ng, d;
    float drop;
  };
  for (bool cudnn : {true, false}) {
    CudnnAttentionScope scope(cudnn);
    for (DType dt : float_dtypes())
      for (const Case& cs : {Case{2, 48, 2, 4, 2, 64, 0.0f}, Case{3, 40, 1, 2, 2, 128, 0.0f},
                             Case{2, 48, 1, 4, 2, 64, 0.2f}, Case{2, 45, 1, 2, 1, 128, 0.2f},
                             // other head dims (issue 35): cuDNN or the CUDA-core kernels, dropout blocks on the latter
                             Case{2, 40, 2, 4, 2, 32, 0.0f}, Case{2, 36, 1, 2, 2, 96, 0.2f},
                             Case{3, 20, 1, 2, 1, 256, 0.1f}}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " cudnn " << cudnn << " cp " << cs.cp << " c " << cs.c
                                          << " d " << cs.d << " dropout " << cs.drop);
        const int64_t S = 2 * cs.cp * cs.c;
        const Shape qs{S, cs.b, cs.nq, cs.d}, ks{S, cs.b, cs.ng, cs.d};
        const Tensor q = rnd(qs, 1, dt, -2, 2), k = rnd(ks, 2, dt, -2, 2), v = rnd(ks, 3, dt), dout = rnd(qs, 4, dt);
        // with dropout the blocks draw their parts of the whole mask (the mcpp kernels: c 45 off the 4-key counters)
        const ops::AttentionOptions opt{.softmax_scale = 1.0f / std::sqrt(static_cast<float>(cs.d)),
                                        .causal = true,
                                        .dropout_p = cs.drop,
                                        .dropout_key = {.seed = 31, .offset = 8}};
        Tensor o = Tensor::empty(qs), lse = Tensor::empty({cs.b, cs.nq, S});
        ops::cpu::flash_attention_fwd(o, lse, q, k, v, opt, {});
        Tensor dq = Tensor::empty(qs), dk = Tensor::empty(ks), dv = Tensor::empty(ks);
        ops::cpu::flash_attention_bwd(dq, dk, dv, dout, q, k, v, o, lse, opt, {});
        const testing::RingSimResult ring = testing::simulate_ring(q, k, v, dout, cs.cp, opt, Device::CUDA, dt);
        EXPECT_REL(ring.out, o, tol(dt, 2e-5));
        EXPECT_REL(ring.lse, lse, 1e-5);
        EXPECT_REL(ring.dq, dq, tol(dt, 5e-5));
        EXPECT_REL(ring.dk, dk, tol(dt, 5e-5));
        EXPECT_REL(ring.dv, dv, tol(dt, 5e-5));
      }
  }
}

TEST(CudaAttentionMerge, MatchesCpu) {
  MCPP_REQUIRE_CUDA();
  const int64_t s = 37, b = 2, nq = 3;
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t d : {64, 40}) {
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " d " << d);
      Tensor o = rnd({s, b, nq, d}, 5), ob = rnd({s, b, nq, d}, 6, dt);
      Tensor l = rnd({b, nq, s}, 7, DType::F32, -3, 3), lb = rnd({b, nq, s}, 8, DType::F32, -3, 3);
      for (int64_t i = 0; i < b * nq * s; i += 5) l.data<float>()[i] = -inf;       // no keys yet: take the block
      for (int64_t i = 2; i < b * nq * s; i += 5) lb.data<float>()[i] = -inf;      // an empty block: keep own
      Tensor od = dev(o), ld = dev(l);
      ops::attention_merge(od, ld, dev(ob, dt), dev(lb));
      ops::cpu::attention_merge(o, l, ob, lb, {});
      EXPECT_REL(host(od), o, 1e-6);
      EXPECT_REL(host(ld), l, 1e-6);
    }
  }
}

}  // namespace
}  // namespace mcpp
