// cuBLASLt algorithm autotuning (kernels/gemm_autotune.h, kernels/cuda/gemm.cpp) vs the CPU backend:
// every GEMM flavour of training (plain with alpha/beta into fp32 C, BIAS, GELU_AUX_BIAS, DGELU(_BGRAD),
// BGRADB wgrad and plain wgrad accumulating with beta = 1 into a non-zero fp32 main grad) matches the CPU
// on the call that tunes (timing must write only its scratch: an accumulation applied more than once, or
// an output left half-written, fails the compare) and on a second call (which must not tune again and
// accumulates exactly once more); the switch off runs the heuristic's #0. Tolerances are those of
// gemm_test.cpp / linear_gelu_test.cpp for the same ops (reasons there): fp32 1e-5, bf16 outputs 4e-3 (one
// rounding) or 1e-2, fp32 grads from bf16 inputs 1e-5; the GELU epilogue's tanh approximation 1e-3 / 5e-3.
// The environment rule of the switch is a CPU test.
#include <cmath>
#include <cstring>
#include <utility>

#include "cuda/cuda_test_util.h"
#include "mcpp/kernels/gemm_autotune.h"

namespace mcpp {
namespace {
using namespace cuda_test;
namespace tune = ops::cuda;

// Autotuning on with every plan untuned; restores the previous switch on exit.
class TuningOn {
 public:
  TuningOn() : prev_(tune::gemm_autotune()) {
    tune::set_gemm_autotune(true);
    tune::reset_gemm_tuning();
  }
  ~TuningOn() { tune::set_gemm_autotune(prev_); }

 private:
  bool prev_;
};

size_t n_records() { return tune::gemm_tune_records().size(); }

void print_records(size_t from) {
  const auto recs = tune::gemm_tune_records();
  for (size_t i = from; i < recs.size(); ++i) {
    std::string ms;
    for (double t : recs[i].candidate_ms) ms += fmt::format(" {:.4f}", t);
    std::printf("[ tuned    ] %s: chosen #%d of%s ms %s\n", recs[i].gemm.c_str(), recs[i].chosen, ms.c_str(),
                recs[i].note.c_str());
  }
}

// With every plan untuned, calls `op` twice: the first call must tune (new records), the second must not;
// `check(call)` compares the outputs after each call (call = 1, 2) with the CPU reference applied that many
// times. Returns how many of the tuned GEMMs had several candidates (so the timing path ran).
template <class Op, class Check>
int tuning_call_then_cached_call(const char* what, Op op, Check check) {
  SCOPED_TRACE(what);
  tune::reset_gemm_tuning();
  op();
  const size_t r1 = n_records();
  EXPECT_GT(r1, 0u) << "the first call did not tune";
  check(1);
  op();
  EXPECT_EQ(n_records(), r1) << "the second call tuned again";
  check(2);
  print_records(0);
  int timed = 0;
  for (const auto& r : tune::gemm_tune_records()) timed += r.candidate_ms.size() > 1 ? 1 : 0;
  return timed;
}

TEST(CudaGemmAutotune, TunedGemmsMatchCpuOnTheTuningCallAndTheNext) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 512, in = 256, out = 384;  // multiples of 8: every epilogue is eligible in bf16
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    TuningOn on;
    int timed = 0;  // tuned GEMMs with several candidates
    Tensor x = rnd({n, in}, 1, dt), w = rnd({out, in}, 2, dt, -0.1, 0.1), bias = rnd({out}, 3, dt);
    Tensor dy = rnd({n, out}, 4, dt), pre = rnd({n, in}, 5, dt, -3, 3);
    Tensor xd = dev(x, dt), wd = dev(w, dt), biasd = dev(bias, dt), dyd = dev(dy, dt), pred = dev(pre, dt);

    {  // plain gemm, alpha 1.5, beta 0.5 into fp32 C: C <- 1.5 x w^T + 0.5 C per call
      const ops::GemmOptions opt{.trans_b = true, .alpha = 1.5f, .beta = 0.5f};
      Tensor ref = rnd({n, out}, 6), c = dev(ref);
      timed += tuning_call_then_cached_call("gemm beta 0.5", [&] { ops::gemm(c, xd, wd, opt); }, [&](int) {
        ops::cpu::gemm(ref, x, w, opt, {});
        EXPECT_REL(host(c), ref, 1e-5);
      });
    }
    {  // linear_fwd with the BIAS epilogue
      Tensor ref = Tensor::empty({n, out}), y;
      ops::cpu::linear_fwd(ref, x, w, &bias, {});
      timed += tuning_call_then_cached_call("linear_fwd BIAS", [&] {
        y = poisoned({n, out}, dt);
        ops::linear_fwd(y, xd, wd, &biasd);
      }, [&](int) { EXPECT_REL(host(y), ref, tol(dt, 1e-5, 4e-3)); });
    }
    {  // linear_gelu_fwd: GELU_AUX_BIAS (aux = pre_act is an output: timing must not write it)
      Tensor act_ref = Tensor::empty({n, out}), pre_ref = Tensor::empty({n, out}), act, pa;
      ops::cpu::linear_gelu_fwd(act_ref, pre_ref, x, w, &bias, {});
      bool fused = false;
      timed += tuning_call_then_cached_call("linear_gelu_fwd GELU_AUX_BIAS", [&] {
        act = poisoned({n, out}, dt), pa = poisoned({n, out}, dt);
        const int64_t f0 = ops::cuda_epilogue_fusion_counts().fwd_fused;
        ops::linear_gelu_fwd(act, pa, xd, wd, &biasd);
        fused = ops::cuda_epilogue_fusion_counts().fwd_fused > f0;
      }, [&](int) {
        EXPECT_REL(host(pa), pre_ref, tol(dt, 1e-5, 4e-3));
        EXPECT_REL(host(act), act_ref, tol(dt, fused ? 1e-3 : 1e-5, 1e-2));
      });
    }
    for (bool with_db : {true, false}) {  // linear_dgelu_bwd: DGELU(_BGRAD); db accumulates into non-zero
      // fc2's W [out, in] read as [h = out, f = in]: dy [n, out] -> dpre [n, in]
      Tensor db_ref = rnd({in}, 7), db = dev(db_ref), dpre_ref = Tensor::empty({n, in}), dpre;
      bool fused = false;
      timed += tuning_call_then_cached_call(with_db ? "linear_dgelu_bwd + db" : "linear_dgelu_bwd", [&] {
        dpre = poisoned({n, in}, dt);
        const auto c0 = ops::cuda_epilogue_fusion_counts();
        ops::linear_dgelu_bwd(dpre, with_db ? &db : nullptr, dyd, wd, pred);
        const auto c1 = ops::cuda_epilogue_fusion_counts();
        fused = c1.bwd_dgelu_bgrad + c1.bwd_dgelu > c0.bwd_dgelu_bgrad + c0.bwd_dgelu;
      }, [&](int) {
        ops::cpu::linear_dgelu_bwd(dpre_ref, with_db ? &db_ref : nullptr, dy, w, pre, {});
        EXPECT_REL(host(dpre), dpre_ref, tol(dt, fused ? 5e-3 : 1e-5, 1e-2));
        if (with_db) EXPECT_REL(host(db), db_ref, tol(dt, fused ? 5e-3 : 1e-5, 1e-2));
      });
    }
    for (bool with_db : {true, false}) {  // linear_bwd: dgrad + wgrad (BGRADB / plain), beta 1 into fp32
      Tensor dw_ref = rnd({out, in}, 8), db_ref = rnd({out}, 9), dx_ref = Tensor::empty({n, in});
      Tensor dw = dev(dw_ref), db = dev(db_ref), dx;
      timed += tuning_call_then_cached_call(with_db ? "linear_bwd BGRADB" : "linear_bwd plain wgrad", [&] {
        dx = poisoned({n, in}, dt);
        ops::linear_bwd(&dx, dw, with_db ? &db : nullptr, dyd, xd, wd, ops::GradWrite::Accumulate);
      }, [&](int) {
        ops::cpu::linear_bwd(&dx_ref, dw_ref, with_db ? &db_ref : nullptr, dy, x, w, ops::GradWrite::Accumulate, {});
        EXPECT_REL(host(dx), dx_ref, tol(dt, 1e-5, 4e-3));
        EXPECT_REL(host(dw), dw_ref, 1e-5);  // accumulated exactly once per call
        if (with_db) EXPECT_REL(host(db), db_ref, 1e-5);
      });
    }
    // The scratch path ran: some plans had more than one candidate, all timed.
    EXPECT_GT(timed, 0) << "no GEMM had several candidates: the timing path was not exercised";
  }
}

TEST(CudaGemmAutotune, SwitchOffRunsTheHeuristicFirstAlgorithm) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 1024, in = 768, out = 2304;  // GPT-2 qkv at 1K tokens, bf16
  Tensor x = rnd({n, in}, 11, DType::BF16), w = rnd({out, in}, 12, DType::BF16, -0.1, 0.1);
  Tensor xd = dev(x, DType::BF16), wd = dev(w, DType::BF16);
  Tensor ref = Tensor::empty({n, out});
  ops::cpu::linear_fwd(ref, x, w, nullptr, {});
  TuningOn on;
  tune::set_gemm_autotune(false);
  Tensor y_off = poisoned({n, out}, DType::BF16), y_off2 = poisoned({n, out}, DType::BF16);
  ops::linear_fwd(y_off, xd, wd, nullptr);
  EXPECT_EQ(tune::last_gemm_algo_index(), 0);
  EXPECT_EQ(n_records(), 0u) << "tuned with the switch off";
  tune::set_gemm_autotune(true);
  Tensor y_on = poisoned({n, out}, DType::BF16);
  ops::linear_fwd(y_on, xd, wd, nullptr);
  ASSERT_EQ(n_records(), 1u);
  const auto rec = tune::gemm_tune_records().back();
  EXPECT_EQ(tune::last_gemm_algo_index(), rec.chosen);
  print_records(0);
  tune::set_gemm_autotune(false);  // the tuned choice is kept but not used while off
  ops::linear_fwd(y_off2, xd, wd, nullptr);
  EXPECT_EQ(tune::last_gemm_algo_index(), 0);
  Tensor a = host(y_off), b = host(y_off2);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "#0 twice must be bitwise the same";
  EXPECT_REL(a, ref, 4e-3);  // one bf16 rounding
  EXPECT_REL(host(y_on), ref, 4e-3);
}

// Data-dependent row counts (MoE experts' tokens): a GEMM seen at many m tunes only its first 16 shapes; the later
// ones run an algorithm borrowed from the family without timing, and every result matches the CPU.
TEST(CudaGemmAutotune, VaryingRowCountsTuneOnlyTheFirstShapesOfAFamily) {
  MCPP_REQUIRE_CUDA();
  const int64_t in = 256, out = 328;  // an out no other test uses: this family starts empty
  Tensor w = rnd({out, in}, 21, DType::BF16, -0.1, 0.1);
  Tensor wd = dev(w, DType::BF16);
  TuningOn on;
  const size_t before = n_records();
  for (int64_t i = 0; i < 24; ++i) {
    const int64_t n = 40 + 56 * i;  // 24 row counts
    SCOPED_TRACE(n);
    Tensor x = rnd({n, in}, 100 + static_cast<uint64_t>(i), DType::BF16);
    Tensor ref = Tensor::empty({n, out});
    ops::cpu::linear_fwd(ref, x, w, nullptr, {});
    Tensor y = poisoned({n, out}, DType::BF16);
    ops::linear_fwd(y, dev(x, DType::BF16), wd, nullptr);
    EXPECT_REL(host(y), ref, 4e-3);  // one bf16 rounding
  }
  EXPECT_EQ(n_records() - before, 16u) << "tuned shapes of one family";
}

// linear_bwd's bias grad both ways (set_bias_grad_path): the BGRADB epilogue and the plain wgrad + the
// column-sum kernel (vector path at out % 8 == 0, scalar path at out = 100) match the CPU on two
// accumulating calls and repeat bit for bit; kAuto with the switch on times both once per shape and
// records the choice, which later calls reuse.
TEST(CudaGemmAutotune, BiasGradFusedAndSplitMatchCpuAndAutoRecordsTheChoice) {
  MCPP_REQUIRE_CUDA();
  struct PathGuard {
    ~PathGuard() { tune::set_bias_grad_path(tune::BiasGradPath::kAuto); }
  } guard;
  struct Case {
    int64_t n, in, out;
  };
  for (const Case& c : {Case{4096, 256, 768}, Case{1000, 64, 100}}) {
    for (DType dt : float_dtypes()) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << c.n << " out=" << c.out);
      Tensor x = rnd({c.n, c.in}, 21, dt), w = rnd({c.out, c.in}, 22, dt, -0.1, 0.1), dy = rnd({c.n, c.out}, 23, dt);
      Tensor xd = dev(x, dt), wd = dev(w, dt), dyd = dev(dy, dt);
      Tensor dw0 = rnd({c.out, c.in}, 24), db0 = rnd({c.out}, 25);
      Tensor dw_ref = dw0.clone(), db_ref = db0.clone();
      for (int call = 0; call < 2; ++call) ops::cpu::linear_bwd(nullptr, dw_ref, &db_ref, dy, x, w,
                                                                ops::GradWrite::Accumulate, {});
      auto run = [&](tune::BiasGradPath path) {
        tune::set_bias_grad_path(path);
        Tensor dw = dev(dw0), db = dev(db0);
        for (int call = 0; call < 2; ++call) ops::linear_bwd(nullptr, dw, &db, dyd, xd, wd, ops::GradWrite::Accumulate);
        EXPECT_REL(host(dw), dw_ref, 1e-5);
        EXPECT_REL(host(db), db_ref, 1e-5);
        return std::pair<Tensor, Tensor>{host(dw), host(db)};
      };
      TuningOn on;
      for (tune::BiasGradPath path : {tune::BiasGradPath::kFused, tune::BiasGradPath::kSplit}) {
        SCOPED_TRACE(path == tune::BiasGradPath::kFused ? "fused" : "split");
        const auto a = run(path), b = run(path);
        EXPECT_EQ(std::memcmp(a.second.raw(), b.second.raw(), a.second.nbytes()), 0) << "db must repeat bitwise";
      }
      tune::reset_gemm_tuning();
      run(tune::BiasGradPath::kAuto);
      int decisions = 0;
      for (const auto& r : tune::gemm_tune_records())
        if (r.gemm.find("bias grad beside") != std::string::npos) {
          ++decisions;
          ASSERT_EQ(r.candidate_ms.size(), 2u);
          ASSERT_EQ(r.candidate_config.size(), 2u);
          EXPECT_TRUE(r.chosen == 0 || r.chosen == 1);
          std::printf("[ decided  ] %s: %.4f / %.4f ms -> #%d (%s)\n", r.gemm.c_str(), r.candidate_ms[0],
                      r.candidate_ms[1], r.chosen, r.candidate_config[r.chosen].c_str());
        }
      if (c.out % 8 == 0) EXPECT_EQ(decisions, 1) << "one decision per shape, reused by the second call";
      else EXPECT_LE(decisions, 1) << "none where cuBLASLt refuses BGRADB";
    }
  }
}

TEST(GemmAutotuneSwitch, EnvironmentValueIsZeroOneOrUnset) {
  EXPECT_TRUE(ops::cuda::parse_gemm_autotune_env(nullptr));  // default on
  EXPECT_TRUE(ops::cuda::parse_gemm_autotune_env("1"));
  EXPECT_FALSE(ops::cuda::parse_gemm_autotune_env("0"));
  try {
    ops::cuda::parse_gemm_autotune_env("yes");
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MCPP_GEMM_AUTOTUNE must be 0 or 1"), std::string::npos) << e.what();
  }
  const bool prev = ops::cuda::gemm_autotune();
  ops::cuda::set_gemm_autotune(!prev);
  EXPECT_EQ(ops::cuda::gemm_autotune(), !prev);
  ops::cuda::set_gemm_autotune(prev);
}

}  // namespace
}  // namespace mcpp
