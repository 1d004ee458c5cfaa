// CUDA AdamW, sum_of_squares and has_non_finite vs the CPU backend.
#include <cstring>
#include <limits>
#include <vector>

#include "cuda/cuda_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

TEST(CudaAdamW, ThreeStepsMatchCpuAndWriteBf16Model) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 10007;
  Tensor p_ref = rnd({n}, 1), m_ref = Tensor::zeros({n}), v_ref = Tensor::zeros({n});
  Tensor p = dev(p_ref), m = dev(m_ref), v = dev(v_ref), model = poisoned({n}, DType::BF16);
  Tensor model_ref = Tensor::empty({n}, DType::BF16);
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor g = rnd({n}, 10 + static_cast<uint64_t>(step), DType::F32, -0.1, 0.1);
    const ops::AdamWOptions opt{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                .step = step};
    ops::cpu::adamw_step(p_ref, m_ref, v_ref, g, &model_ref, opt, {});
    ops::adamw_step(p, m, v, dev(g), &model, opt);
  }
  // same float32 operation order; only FMA contraction on the GPU differs: ~1 ulp
  EXPECT_REL(host(p), p_ref, 1e-6);
  EXPECT_REL(host(m), m_ref, 1e-6);
  EXPECT_REL(host(v), v_ref, 1e-6);
  EXPECT_REL(host(model), model_ref.to(DType::F32), 4e-3);  // bf16 copy: one rounding (ties may differ)
}

// Bitwise equality of two tensors (copied to the host).
bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

TEST(CudaAdamW, MultiTensorStepIsBitIdenticalToCpuAndPerTensorCuda) {
  MCPP_REQUIRE_CUDA();
  // 41 entries (> kAdamMaxTensors = 32 per launch), sizes that are and are not multiples of 4/8, one
  // crossing a 64K chunk, one of > 320 chunks (several launches for one tensor), views at odd offsets
  // (scalar path), bf16 / f32 / no model copies, with and without weight decay.
  std::vector<int64_t> sizes{1, 3, 4, 7, 8, 9, 4096, 65536, 65539, 131072, 321 * 65536 + 5};
  while (sizes.size() < 41) sizes.push_back(100 + 37 * static_cast<int64_t>(sizes.size()));
  struct Entry {
    Tensor p_cpu, m_cpu, v_cpu, model_cpu;   // CPU reference (adamw_step per entry)
    ops::AdamWTensors multi, single;         // CUDA: adamw_multi_step / adamw_step per entry
    DType model_dtype;
  };
  std::vector<Entry> es;
  auto view = [](int64_t n, bool odd, DType dt) {  // a fresh CUDA zero tensor, or a view at element offset 1
    if (!odd) return Tensor::zeros({n}, dt, Device::CUDA);
    return Tensor::zeros({n + 1}, dt, Device::CUDA).flat_slice(1, {n});
  };
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    const bool odd = k % 5 == 3;
    const DType md = k % 3 == 0 ? DType::BF16 : DType::F32;
    const bool with_model = k % 4 != 2;
    Entry e;
    e.model_dtype = md;
    e.p_cpu = rnd({n}, 300 + k);
    e.m_cpu = Tensor::zeros({n});
    e.v_cpu = Tensor::zeros({n});
    e.model_cpu = with_model ? Tensor::zeros({n}, md) : Tensor();
    for (ops::AdamWTensors* t : {&e.multi, &e.single}) {
      t->param = view(n, odd, DType::F32);
      ops::cast(t->param, dev(e.p_cpu));
      t->exp_avg = view(n, odd, DType::F32);
      t->exp_avg_sq = view(n, odd, DType::F32);
      t->grad = view(n, odd, DType::F32);
      t->param_model = with_model ? view(n, odd, md) : Tensor();
      t->weight_decay = k % 2 ? 0.0f : 0.1f;
    }
    es.push_back(std::move(e));
  }
  std::vector<ops::AdamWTensors> list;
  for (const Entry& e : es) list.push_back(e.multi);
  for (int64_t step = 1; step <= 2; ++step) {
    // step 2 with a clip coefficient folded in (grad_scale): still bit-identical to the CPU
    const ops::AdamWOptions opt{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f,
                                .step = step, .grad_scale = step == 2 ? 0.37f : 1.0f};
    for (size_t k = 0; k < es.size(); ++k) {
      Entry& e = es[k];
      Tensor g = rnd({sizes[k]}, 400 + 50 * static_cast<uint64_t>(step) + k, DType::F32, -0.1, 0.1);
      Tensor gd = dev(g);
      ops::cast(e.multi.grad, gd);
      ops::cast(e.single.grad, gd);
      ops::AdamWOptions o = opt;
      o.weight_decay = e.multi.weight_decay;
      ops::cpu::adamw_step(e.p_cpu, e.m_cpu, e.v_cpu, g, e.model_cpu.defined() ? &e.model_cpu : nullptr, o, {});
      ops::adamw_step(e.single.param, e.single.exp_avg, e.single.exp_avg_sq, e.single.grad,
                      e.single.param_model.defined() ? &e.single.param_model : nullptr, o);
    }
    ops::adamw_multi_step(list, opt);
  }
  for (size_t k = 0; k < es.size(); ++k) {
    const Entry& e = es[k];
    SCOPED_TRACE(::testing::Message() << "entry " << k << " n=" << sizes[k]);
    // explicitly rounded float32 operations on the GPU, -ffp-contract=off on the CPU: bit-identical
    EXPECT_TRUE(same_bits(e.multi.param, e.p_cpu));
    EXPECT_TRUE(same_bits(e.multi.exp_avg, e.m_cpu));
    EXPECT_TRUE(same_bits(e.multi.exp_avg_sq, e.v_cpu));
    if (e.model_cpu.defined()) {
      EXPECT_TRUE(same_bits(e.multi.param_model, e.model_cpu));
    }
    EXPECT_TRUE(same_bits(e.multi.param, e.single.param));
    EXPECT_TRUE(same_bits(e.multi.exp_avg_sq, e.single.exp_avg_sq));
    if (e.model_cpu.defined()) {
      EXPECT_TRUE(same_bits(e.multi.param_model, e.single.param_model));
    }
  }
  list[2].grad = Tensor::zeros({5}, DType::F32, Device::CUDA);
  EXPECT_THROW(ops::adamw_multi_step(list, ops::AdamWOptions{}), Error);
}

TEST(CudaReductions, SumOfSquaresAndNonFinite) {
  MCPP_REQUIRE_CUDA();
  Tensor x = rnd({1000003}, 2);
  Tensor xd = dev(x);
  const double want = ops::cpu::sum_of_squares(x, {});
  const double got = ops::sum_of_squares(xd);
  EXPECT_NEAR(got, want, 1e-10 * want);  // float64 accumulation both sides, different order
  EXPECT_EQ(ops::sum_of_squares(xd), got);  // deterministic: fixed reduction tree
  EXPECT_FALSE(ops::has_non_finite(xd));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    Tensor y = x.clone();
    y.data<float>()[777777] = bad;
    EXPECT_TRUE(ops::has_non_finite(dev(y)));
    EXPECT_TRUE(ops::cpu::has_non_finite(y, {}));
  }
}

}  // namespace
}  // namespace mcpp
