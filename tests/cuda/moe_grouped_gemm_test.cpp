// Grouped-GEMM MoE on the device (--moe-grouped-gemm; kernels/cuda/grouped_gemm*.{cpp,cu}, transformer/moe/
// grouped_mlp.h) against the CPU backend:
//   - ops::grouped_linear_fwd / _dgrad / _wgrad (with biases; accumulate and overwrite) over groups of uneven rows,
//     empty groups among them (first, middle, last), more rows than one tile and widths that are not multiples of the
//     tiles: fp32 (the FMA kernel), bf16 at widths that are multiples of 8 (the tensor-core kernel) and at odd widths
//     (the FMA kernel on bf16). The counts live on the device only;
//   - the fused GELU ops (grouped_linear_gelu_fwd with and without biases, grouped_linear_dgelu_bwd) the same ways;
//   - the same ops with the counts on the host (cuBLASLt, kernels/cuda/grouped_gemm_lt.cpp): one pointer-array batched
//     GEMM per op when every group has the same rows, the bias / GELU / gelu' in its epilogue
//     (MCPP_GROUPED_GEMM_EPILOGUES=1) or in passes after it, one GEMM per group otherwise (the paths counted);
//   - a GPT MoE trained with --moe-grouped-gemm gives SequentialMLP's losses (fp32 and bf16), dropless and padded (the
//     padded layers on the batched path, with and without its epilogues); padded under --enable-cuda-graph gives the
//     eager run's;
//   - dropless MoE with --moe-grouped-gemm under --enable-cuda-graph gives the eager run's losses (the counts read on
//     the device at every replay).
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

Tensor counts_of(const std::vector<int64_t>& c, Device d) {
  Tensor t = Tensor::empty({static_cast<int64_t>(c.size())}, DType::I64);
  std::copy(c.begin(), c.end(), t.data<int64_t>());
  return t.to(d);
}

std::vector<Tensor> on_device(const std::vector<Tensor>& ts, DType dt) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(dev(t, dt));
  return out;
}

// Tolerances (relative L2 against the CPU on the same bf16-representable inputs): fp32 outputs differ by the
// summation order only (1e-5); bf16 activations carry one output rounding (2^-9 per element: 4e-3); the weight grads
// are fp32 sums of bf16 products (order only: 1e-5) and the bias grads fp32 serial sums (1e-5).
// host_counts: the counts passed as a host tensor (the cuBLASLt path) instead of a device one.
void check(DType dt, int64_t in, int64_t out, const std::vector<int64_t>& rows, bool host_counts = false) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " in " << in << " out " << out
                                    << (host_counts ? " host counts" : " device counts"));
  const int64_t g = static_cast<int64_t>(rows.size());
  int64_t m = 0;
  for (int64_t r : rows) m += r;
  const double tol = dt == DType::F32 ? 1e-5 : 4e-3;
  Tensor x = rnd({m, in}, 1, dt), dy = rnd({m, out}, 2, dt);
  std::vector<Tensor> w, b, dw0, db0;
  for (int64_t i = 0; i < g; ++i) {
    w.push_back(rnd({out, in}, 10 + static_cast<uint64_t>(i), dt));
    b.push_back(rnd({out}, 30 + static_cast<uint64_t>(i), dt));
    dw0.push_back(rnd({out, in}, 50 + static_cast<uint64_t>(i)));
    db0.push_back(rnd({out}, 70 + static_cast<uint64_t>(i)));
  }
  const Tensor counts = counts_of(rows, Device::CPU);
  const Tensor dcounts = host_counts ? counts : counts_of(rows, Device::CUDA);
  // forward with and without biases
  Tensor y_cpu = Tensor::empty({m, out}), y0_cpu = Tensor::empty({m, out});
  ops::cpu::grouped_linear_fwd(y_cpu, x, w, b, counts, {});
  ops::cpu::grouped_linear_fwd(y0_cpu, x, w, {}, counts, {});
  Tensor y = poisoned({m, out}, dt), y0 = poisoned({m, out}, dt);
  ops::grouped_linear_fwd(y, dev(x, dt), on_device(w, dt), on_device(b, dt), dcounts);
  ops::grouped_linear_fwd(y0, dev(x, dt), on_device(w, dt), {}, dcounts);
  EXPECT_REL(host(y), y_cpu, tol);
  EXPECT_REL(host(y0), y0_cpu, tol);
  // fc1 + GELU, with and without biases: act and the pre_act kept
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "gelu fwd, bias" : "gelu fwd");
    Tensor act_cpu = Tensor::empty({m, out}), pre_cpu = Tensor::empty({m, out});
    ops::cpu::grouped_linear_gelu_fwd(act_cpu, pre_cpu, x, w, with_bias ? b : std::vector<Tensor>{}, counts, {});
    Tensor act = poisoned({m, out}, dt), pre = poisoned({m, out}, dt);
    ops::grouped_linear_gelu_fwd(act, pre, dev(x, dt), on_device(w, dt),
                                 with_bias ? on_device(b, dt) : std::vector<Tensor>{}, dcounts);
    EXPECT_REL(host(act), act_cpu, tol);
    EXPECT_REL(host(pre), pre_cpu, tol);
  }
  // dgrad
  Tensor dx_cpu = Tensor::empty({m, in});
  ops::cpu::grouped_linear_dgrad(dx_cpu, dy, w, counts, {});
  Tensor dx = poisoned({m, in}, dt);
  ops::grouped_linear_dgrad(dx, dev(dy, dt), on_device(w, dt), dcounts);
  EXPECT_REL(host(dx), dx_cpu, tol);
  // fc2's dgrad with gelu': w_g [out, in] read as fc2's, pre_act [m, in] the kept GELU input
  {
    Tensor pre = rnd({m, in}, 3, dt), dpre_cpu = Tensor::empty({m, in});
    ops::cpu::grouped_linear_dgelu_bwd(dpre_cpu, dy, w, pre, counts, {});
    Tensor dpre = poisoned({m, in}, dt);
    ops::grouped_linear_dgelu_bwd(dpre, dev(dy, dt), on_device(w, dt), dev(pre, dt), dcounts);
    EXPECT_REL(host(dpre), dpre_cpu, tol);
  }
  // wgrad into fp32 main grads: accumulate onto old values, and overwrite (poisoned: every element written, the empty
  // groups' too)
  for (bool overwrite : {false, true}) {
    SCOPED_TRACE(overwrite ? "overwrite" : "accumulate");
    const ops::GradWrite gw = overwrite ? ops::GradWrite::Overwrite : ops::GradWrite::Accumulate;
    std::vector<Tensor> dw_cpu, db_cpu, dw_dev, db_dev;
    for (int64_t i = 0; i < g; ++i) {
      dw_cpu.push_back(dw0[static_cast<size_t>(i)].clone());
      db_cpu.push_back(db0[static_cast<size_t>(i)].clone());
      dw_dev.push_back(overwrite ? poisoned({out, in}, DType::F32) : dev(dw0[static_cast<size_t>(i)]));
      db_dev.push_back(overwrite ? poisoned({out}, DType::F32) : dev(db0[static_cast<size_t>(i)]));
    }
    ops::cpu::grouped_linear_wgrad(dw_cpu, db_cpu, dy, x, counts, gw, {});
    ops::grouped_linear_wgrad(dw_dev, db_dev, dev(dy, dt), dev(x, dt), dcounts, gw);
    for (int64_t i = 0; i < g; ++i) {
      SCOPED_TRACE(::testing::Message() << "group " << i << " rows " << rows[static_cast<size_t>(i)]);
      const Tensor got_w = host(dw_dev[static_cast<size_t>(i)]), got_b = host(db_dev[static_cast<size_t>(i)]);
      if (overwrite && rows[static_cast<size_t>(i)] == 0) {  // an empty group's grads are zero
        EXPECT_EQ(ops::sum_of_squares(got_w), 0.0);
        EXPECT_EQ(ops::sum_of_squares(got_b), 0.0);
        continue;
      }
      EXPECT_REL(got_w, dw_cpu[static_cast<size_t>(i)], 1e-5);
      EXPECT_REL(got_b, db_cpu[static_cast<size_t>(i)], 1e-5);
    }
  }
}

const std::vector<int64_t> kRows = {0, 300, 1, 0, 129, 17, 0};  // 447 rows: uneven, empty first / middle / last

TEST(CudaMoeGroupedGemm, Fp32OpsMatchCpu) {
  MCPP_REQUIRE_CUDA();
  check(DType::F32, 72, 136, kRows);
  check(DType::F32, 36, 20, kRows);
}

TEST(CudaMoeGroupedGemm, Bf16TensorCoreOpsMatchCpu) {  // widths multiples of 8, not of the 128 x 128 x 32 tiles
  MCPP_REQUIRE_CUDA();
  check(DType::BF16, 264, 136, kRows);
  check(DType::BF16, 128, 256, {512, 0, 256, 1});
}

TEST(CudaMoeGroupedGemm, Bf16OddWidthOpsMatchCpu) {  // the FMA kernel on bf16
  MCPP_REQUIRE_CUDA();
  check(DType::BF16, 36, 20, kRows);
}

TEST(CudaMoeGroupedGemm, SizesComeFromTheDeviceCounts) {  // one launch, other counts: no host copy of the sizes
  MCPP_REQUIRE_CUDA();
  check(DType::BF16, 64, 64, {100, 28});
  check(DType::BF16, 64, 64, {28, 100});
}

// MCPP_GROUPED_GEMM_EPILOGUES (grouped_gemm_lt.cpp: the batched GEMMs' epilogues, off until proven on a device) for
// the scope.
struct GroupedEpilogues {
  explicit GroupedEpilogues(bool on) { ::setenv("MCPP_GROUPED_GEMM_EPILOGUES", on ? "1" : "0", 1); }
  ~GroupedEpilogues() { ::unsetenv("MCPP_GROUPED_GEMM_EPILOGUES"); }
  GroupedEpilogues(const GroupedEpilogues&) = delete;
  GroupedEpilogues& operator=(const GroupedEpilogues&) = delete;
};

// Host counts: every group the same rows runs one batched cuBLASLt GEMM per op (fwd and the GELU fwd each with and
// without biases, dgrad, the gelu' dgrad, the wgrad twice), with MCPP_GROUPED_GEMM_EPILOGUES=1 the bias, GELU and
// gelu' in the epilogues of four of them (else in passes after); uneven rows (empty groups among them) one GEMM per
// group. bf16 and fp32, both widths' orders (fc1's and fc2's).
TEST(CudaMoeGroupedGemm, HostCountsRunCublasLtBatchedOrPerGroup) {
  MCPP_REQUIRE_CUDA();
  for (bool epilogues : {false, true})
    for (DType dt : {DType::BF16, DType::F32}) {
      SCOPED_TRACE(epilogues ? "epilogues" : "passes");
      const GroupedEpilogues scope(epilogues);
      const ops::GroupedGemmPathCounts before = ops::cuda_grouped_gemm_path_counts();
      check(dt, 96, 384, {256, 256, 256, 256}, true);
      check(dt, 384, 96, {130, 130, 130}, true);
      const ops::GroupedGemmPathCounts mid = ops::cuda_grouped_gemm_path_counts();
      EXPECT_EQ(mid.batched - before.batched, 2 * 8) << dtype_name(dt);
      EXPECT_EQ(mid.batched_epilogue - before.batched_epilogue, epilogues ? 2 * 4 : 0)  // fwd, GELU x2, gelu'
          << dtype_name(dt);
      EXPECT_EQ(mid.per_group, before.per_group) << dtype_name(dt);
      check(dt, 72, 136, kRows, true);
      const ops::GroupedGemmPathCounts after = ops::cuda_grouped_gemm_path_counts();
      EXPECT_EQ(after.per_group - mid.per_group, 8) << dtype_name(dt);
      EXPECT_EQ(after.batched, mid.batched) << dtype_name(dt);
    }
}

// A switch value other than 0 / 1 is an error naming the variable, raised before any GEMM runs.
TEST(CudaMoeGroupedGemm, BadEpilogueSwitchIsANamedError) {
  MCPP_REQUIRE_CUDA();
  const GroupedEpilogues scope(true);
  ::setenv("MCPP_GROUPED_GEMM_EPILOGUES", "yes", 1);
  const int64_t in = 64, out = 64;
  std::vector<Tensor> w = {dev(rnd({out, in}, 1), DType::BF16), dev(rnd({out, in}, 2), DType::BF16)};
  Tensor x = dev(rnd({32, in}, 3), DType::BF16), act = poisoned({32, out}, DType::BF16),
         pre = poisoned({32, out}, DType::BF16);
  const std::string e = training_test::error_of(
      [&] { ops::grouped_linear_gelu_fwd(act, pre, x, w, {}, counts_of({16, 16}, Device::CPU)); });
  EXPECT_NE(e.find("MCPP_GROUPED_GEMM_EPILOGUES must be 0 or 1; got 'yes'"), std::string::npos) << e;
}

// The tiny GPU config with 4 experts top-2 (dropless unless padded), grouped or not; 8 iterations.
Config moe_config(const std::filesystem::path& dir, bool bf16, bool grouped, bool padded) {
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.model.num_moe_experts = 4;
  c.model.moe_router_topk = 2;
  c.model.moe_ffn_hidden_size = 256;
  c.model.moe_aux_loss_coeff = 0.01f;
  c.model.moe_z_loss_coeff = 0.001f;
  c.model.moe_grouped_gemm = grouped;
  if (padded) {
    c.model.moe_expert_capacity_factor = 1.0;
    c.model.moe_pad_expert_input_to_capacity = true;
  }
  c.training.bf16 = bf16;
  c.validate();
  return c;
}

// Grouped vs SequentialMLP on the GPU: other GEMM kernels (summation order; bf16, dropless: the GELU not in fc1's
// cuBLASLt epilogue), the same routing. fp32: 1e-4 relative per iteration's loss (order-of-summation drift over 8 Adam
// steps); bf16: 1e-2 (bf16 roundings of the activations in other places).
TEST(CudaMoeGroupedGemm, GptTrainingMatchesSequentialExperts) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_cuda_moe_gg_" + std::to_string(::getpid()));
  for (bool bf16 : {false, true})
    for (int variant = 0; variant < 3; ++variant) {  // dropless; padded; padded with the batched GEMMs' epilogues
      const bool padded = variant > 0;
      const GroupedEpilogues scope(variant == 2);
      SCOPED_TRACE(::testing::Message() << (bf16 ? "bf16" : "fp32") << (padded ? " padded" : " dropless")
                                        << (variant == 2 ? " epilogues" : ""));
      const TrainSummary seq = Trainer(moe_config(dir, bf16, false, padded), 99, training_test::single()).train();
      const int64_t batched = ops::cuda_grouped_gemm_path_counts().batched;
      const TrainSummary grp = Trainer(moe_config(dir, bf16, true, padded), 99, training_test::single()).train();
      if (padded) {
        EXPECT_GT(ops::cuda_grouped_gemm_path_counts().batched, batched);  // the batched GEMMs ran
      }
      ASSERT_EQ(seq.losses.size(), 8u);
      ASSERT_EQ(grp.losses.size(), 8u);
      const double tol = bf16 ? 1e-2 : 1e-4;
      for (size_t i = 0; i < 8; ++i)
        EXPECT_NEAR(grp.losses[i], seq.losses[i], tol * seq.losses[i]) << "iteration " << i + 1;
    }
  std::filesystem::remove_all(dir);
}

// Grouped GEMMs under graphs give the eager run's losses (the same kernels: 1e-5 relative), fp32 and bf16.
void check_graphs_match_eager(bool padded) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ((padded ? "mcpp_cuda_moe_gg_pad_" : "mcpp_cuda_moe_gg_graph_") + std::to_string(::getpid()));
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    Config c = moe_config(dir, bf16, true, padded);
    const TrainSummary eager = Trainer(c, 99, training_test::single()).train();
    const TrainSummary graphed = training_test::train_graphed(c);
    ASSERT_EQ(graphed.losses.size(), 8u);
    EXPECT_EQ(graphed.cuda_graph_replays, 6);
    for (size_t i = 0; i < 8; ++i)
      EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-5 * eager.losses[i]) << "iteration " << i + 1;
  }
  std::filesystem::remove_all(dir);
}

// Padded: the batched GEMMs' address tables are written on the stream, so the replays run on the step's buffers.
TEST(CudaMoeGroupedGemm, PaddedWithGraphsMatchesEagerTraining) {  // the batched GEMMs, with and without epilogues
  MCPP_REQUIRE_CUDA();
  for (bool epilogues : {false, true}) {
    SCOPED_TRACE(epilogues ? "epilogues" : "passes");
    const GroupedEpilogues scope(epilogues);
    check_graphs_match_eager(true);
  }
}

// Dropless: the replays route with the router's device counts each step, as the eager steps do.
TEST(CudaMoeGroupedGemm, DroplessWithGraphsMatchesEagerTraining) {
  MCPP_REQUIRE_CUDA();
  check_graphs_match_eager(false);
}

}  // namespace
}  // namespace mcpp::cuda_test
