// CUDA graphs (core/cuda_graph.h) and the trainer's --enable-cuda-graph on the device:
//   - a captured region of ops (allocations inside) replays with new static inputs and gives the eager
//     result each time; the capture itself runs nothing;
//   - what a captured step must not do fails with a named mcpp::Error and leaves the stream usable: a
//     device->host read, a tensor created inside that outlives the region;
//   - a tensor allocated before the capture and dropped inside it stays valid for the replays;
//   - masked_loss_stats / masked_loss_grad on CUDA equal the CPU backend;
//   - training a bf16 GPT with --enable-cuda-graph (eager warm-up, capture, replays, an eager evaluation in
//     between) gives the eager run's losses (same kernels; only atomics-ordered sums may differ); with
//     hidden dropout (fp32) too: every replay draws that step's masks; MoE layers padded to capacity too (their
//     routing statistics and logged losses on the device).
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "mcpp/core/cuda_graph.h"
#include "mcpp/training/trainer.h"
#include "models/gpt_test_util.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

using training_test::error_of;

TEST(CudaGraph, ReplaysTheCapturedOpsOnNewInputs) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 96, in = 64, out = 80;
  Tensor w = dev(rnd({out, in}, 2));
  Tensor x = Tensor::empty({n, in}, DType::F32, Device::CUDA);  // static input
  Tensor y = Tensor::empty({n, out}, DType::F32, Device::CUDA);  // static output
  auto body = [&] {
    Tensor t = Tensor::empty({n, out}, DType::F32, Device::CUDA);  // allocated and freed inside
    ops::linear_fwd(t, x, w, nullptr);
    ops::scale_inplace(t, 2.0f);
    y.copy_from(t);
  };
  x.copy_from(rnd({n, in}, 3));
  body();  // eager warm-up (plans)
  CudaGraph g;
  ops::scale_inplace(y, 0.0f);
  g.capture(body);
  EXPECT_EQ(rel_err(host(y), Tensor::zeros({n, out})), 0.0) << "capturing must not run the work";
  EXPECT_TRUE(g.captured());
  EXPECT_GE(g.num_nodes(), 3);
  for (uint64_t seed : {11u, 12u}) {
    Tensor xh = rnd({n, in}, seed);
    x.copy_from(xh);
    g.replay();
    Tensor want = Tensor::empty({n, out});
    ops::cpu::linear_fwd(want, xh, host(w), nullptr, {});
    ops::cpu::scale_inplace(want, 2.0f, {});
    EXPECT_REL(host(y), want, 1e-5);
  }
  EXPECT_EQ(g.replays(), 2);
}

TEST(CudaGraph, HostReadAndEscapingTensorAreNamedErrors) {
  MCPP_REQUIRE_CUDA();
  Tensor y = dev(rnd({16, 16}, 5));
  CudaGraph read;
  const std::string e1 = error_of([&] { read.capture([&] { Tensor h = y.to(Device::CPU); }); });
  EXPECT_NE(e1.find("CUDA-graph capture failed"), std::string::npos) << e1;
  EXPECT_NE(e1.find("device->host"), std::string::npos) << e1;
  EXPECT_FALSE(read.captured());
  ops::scale_inplace(y, 2.0f);  // the stream works eagerly afterwards
  EXPECT_TRUE(std::isfinite(host(y).data<float>()[0]));

  Tensor escaped;
  CudaGraph leak;
  const std::string e2 = error_of([&] {
    leak.capture([&] {
      escaped = Tensor::empty({1024}, DType::F32, Device::CUDA);
      ops::scale_inplace(escaped, 1.0f);
    });
  });
  EXPECT_NE(e2.find("still alive"), std::string::npos) << e2;
  escaped = Tensor();
  Tensor z = dev(rnd({16, 16}, 6));
  ops::add_inplace(z, y);
  EXPECT_TRUE(std::isfinite(host(z).data<float>()[0]));
}

TEST(CudaGraph, TensorDroppedInsideTheCaptureStaysValidForReplays) {
  MCPP_REQUIRE_CUDA();
  Tensor src = dev(rnd({256}, 8));
  Tensor out = Tensor::empty({256}, DType::F32, Device::CUDA);
  Tensor scratch = Tensor::empty({256}, DType::F32, Device::CUDA);  // allocated before the capture
  CudaGraph g;
  g.capture([&] {
    scratch.copy_from(src);
    ops::scale_inplace(scratch, 3.0f);
    out.copy_from(scratch);
    scratch = Tensor();  // dropped inside: the graph keeps its memory
  });
  Tensor other = Tensor::zeros({256}, DType::F32, Device::CUDA);  // must not get the held memory
  g.replay();
  g.replay();
  Tensor want = host(src);
  ops::cpu::scale_inplace(want, 3.0f, {});
  EXPECT_EQ(rel_err(host(out), want), 0.0);
  EXPECT_EQ(rel_err(host(other), Tensor::zeros({256})), 0.0);
}

TEST(CudaMaskedLoss, StatsAndGradMatchCpu) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 33000;
  Tensor loss = rnd({n}, 21, DType::F32, 0.0, 11.0);
  Tensor mask = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) mask.data<float>()[i] = (i % 7 == 0) ? 0.0f : 1.0f;
  Tensor stats_c = Tensor::empty({2}), stats_g = Tensor::empty({2}, DType::F32, Device::CUDA);
  ops::cpu::masked_loss_stats(stats_c, loss, mask, {});
  ops::masked_loss_stats(stats_g, dev(loss), dev(mask));
  Tensor sg = host(stats_g);
  EXPECT_NEAR(sg.data<float>()[0], stats_c.data<float>()[0], 1e-6 * stats_c.data<float>()[0]);
  EXPECT_EQ(sg.data<float>()[1], stats_c.data<float>()[1]);
  for (bool per_token : {false, true}) {
    Tensor dc = Tensor::empty({n}), dg = Tensor::empty({n}, DType::F32, Device::CUDA);
    ops::cpu::masked_loss_grad(dc, mask, stats_c, 0.5f, per_token, {});
    ops::masked_loss_grad(dg, dev(mask), dev(stats_c), 0.5f, per_token);
    EXPECT_EQ(rel_err(host(dg), dc), 0.0) << "per_token " << per_token;
  }
}

// Hidden dropout under graphs (fp32: eager and graphed runs then differ only by atomics-ordered sums, so a
// repeated or shifted mask would show): the replays draw each step's own masks, and the RNG state the
// trainer would checkpoint equals the eager run's.
TEST(CudaGraphTraining, DropoutDrawsFreshMasksEveryReplay) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_cuda_graph_do_" + std::to_string(::getpid()));
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.model.hidden_dropout = 0.2f;
  c.validate();
  const TrainSummary eager = Trainer(c, 99, training_test::single()).train();
  const TrainSummary graphed = training_test::train_graphed(c);
  c.model.hidden_dropout = 0.0f;
  const TrainSummary no_dropout = Trainer(c, 99, training_test::single()).train();
  std::filesystem::remove_all(dir);
  EXPECT_EQ(graphed.cuda_graph_replays, 6);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-5 * eager.losses[i]) << "iteration " << i + 1;
    EXPECT_GT(std::abs(eager.losses[i] - no_dropout.losses[i]), 1e-4) << "dropout has no effect: iteration " << i + 1;
  }
}

// Attention dropout on cuDNN's fused attention (bf16) under graphs: its Philox offset is read from the key's
// device base when the replay runs (a one-thread kernel inside the graph), so every replay draws that
// step's mask. --deterministic-mode (cuDNN's deterministic backward, GEMM autotuning off): the graphed run
// equals the eager one to float rounding of the loss read-back; a replay with a stale mask would be off by
// the dropout's effect, checked against a run without it.
TEST(CudaGraphTraining, AttentionDropoutOnCudnnDrawsFreshMasksEveryReplay) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_cuda_graph_ado_" + std::to_string(::getpid()));
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.training.bf16 = true;
  c.model.deterministic_mode = true;
  c.model.attention_dropout = 0.1f;
  c.validate();
  const auto c0 = ops::cuda_cudnn_attention_counts();
  const TrainSummary eager = Trainer(c, 99, training_test::single()).train();
  const bool on_cudnn = ops::cuda_cudnn_attention_counts().fwd > c0.fwd;
  const TrainSummary graphed = training_test::train_graphed(c);
  c.model.attention_dropout = 0.0f;
  const TrainSummary no_dropout = Trainer(c, 99, training_test::single()).train();
  std::filesystem::remove_all(dir);
  if (!on_cudnn) std::printf("[ note ] cuDNN had no engine: the mcpp kernels' dropout ran\n");
  EXPECT_EQ(graphed.cuda_graph_replays, 6);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-6 * eager.losses[i]) << "iteration " << i + 1;
    EXPECT_GT(std::abs(eager.losses[i] - no_dropout.losses[i]), 1e-4) << "dropout has no effect: iteration " << i + 1;
  }
}

TEST(CudaGraphTraining, Bf16GptWithGraphsMatchesEagerTraining) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_cuda_graph_" + std::to_string(::getpid()));
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.training.bf16 = true;
  c.validate();
  const TrainSummary eager = Trainer(c, 99, training_test::single()).train();
  const TrainSummary graphed = training_test::train_graphed(c);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(graphed.losses.size(), 8u);
  EXPECT_EQ(graphed.cuda_graph_replays, 6);  // steps 3..8: captured at step 3, replayed from it on
  EXPECT_GT(graphed.cuda_graph_nodes, 50);
  for (size_t i = 0; i < 8; ++i)
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-3 * eager.losses[i]) << "iteration " << i + 1;
  EXPECT_LT(graphed.losses.back(), graphed.losses[2]);  // the replays train
  EXPECT_NEAR(graphed.last_valid_loss, eager.last_valid_loss, 1e-3 * eager.last_valid_loss);
  EXPECT_GT(cuda_peak_memory_bytes(), 0u);
}

// Multi-token prediction under graphs (bf16, 2 depths, RoPE): the rolled tokens / labels / mask, the depths' fused
// losses and the log's MTP tracker stay on the device, so the replays train and log as the eager steps do.
TEST(CudaGraphTraining, MtpWithGraphsMatchesEagerTraining) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_cuda_graph_mtp_" + std::to_string(::getpid()));
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.training.bf16 = true;
  c.model.position_embedding_type = PositionEmbedding::Rope;
  c.model.mtp_num_layers = 2;
  c.training.log_interval = 1;
  c.validate();
  c.training.metrics_path = (dir / "eager.jsonl").string();
  const TrainSummary eager = Trainer(c, 99, training_test::single()).train();
  const TrainSummary graphed = training_test::train_graphed(c, (dir / "graphed.jsonl").string());
  auto mtp_losses = [](const std::string& metrics) {
    std::vector<std::vector<double>> out;
    std::ifstream f(metrics);
    for (std::string line; std::getline(f, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("event", "") == "train") out.push_back(j.at("mtp_losses").get<std::vector<double>>());
    }
    return out;
  };
  const auto want = mtp_losses((dir / "eager.jsonl").string()), got = mtp_losses((dir / "graphed.jsonl").string());
  std::filesystem::remove_all(dir);
  ASSERT_EQ(graphed.losses.size(), 8u);
  EXPECT_EQ(graphed.cuda_graph_replays, 6);
  ASSERT_EQ(want.size(), 8u);
  ASSERT_EQ(got.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-3 * eager.losses[i]) << "iteration " << i + 1;
    ASSERT_EQ(got[i].size(), 2u);
    for (size_t k = 0; k < 2; ++k)
      EXPECT_NEAR(got[i][k], want[i][k], 1e-3 * want[i][k]) << "iteration " << i + 1 << " depth " << k + 1;
  }
  EXPECT_LT(got.back()[0], got[2][0]);  // the depths train under the replays
}

// Multi-latent attention under graphs (bf16, query compression, latent norms, YaRN, head dim 192 on cuDNN with the
// values padded): the column copies, the padding's memset and the MLA kernels capture; the replays train as the
// eager steps do.
TEST(CudaGraphTraining, MlaWithGraphsMatchesEagerTraining) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_cuda_graph_mla_" + std::to_string(::getpid()));
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.training.bf16 = true;
  testing::enable_mla(c.model, testing::mla_gpu_dims());
  c.training.log_interval = 1;
  c.validate();
  const TrainSummary eager = Trainer(c, 99, training_test::single()).train();
  const TrainSummary graphed = training_test::train_graphed(c);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(graphed.losses.size(), 8u);
  EXPECT_EQ(graphed.cuda_graph_replays, 6);
  for (size_t i = 0; i < 8; ++i)
    EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-3 * eager.losses[i]) << "iteration " << i + 1;
  EXPECT_LT(graphed.losses.back(), graphed.losses[2]);  // it trains under the replays
}

// The router losses each metrics record logs (load_balancing_loss or seq_load_balancing_loss, z_loss).
std::vector<std::pair<double, double>> router_losses(const std::string& metrics) {
  std::vector<std::pair<double, double>> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("event", "") != "train") continue;
    const double lb = j.value("load_balancing_loss", j.value("seq_load_balancing_loss", -1.0));
    out.emplace_back(lb, j.value("z_loss", -1.0));
  }
  return out;
}

// MoE layers padded to capacity under graphs (fp32): the router's statistics, its losses (the log's tracker) and the
// expert bias's route counts stay on the device, so the replays route, balance and log as the eager steps do —
// the switch loss with the z-loss, and DeepSeek-V3's router (sigmoid, groups, expert bias, sequence-wise loss).
TEST(CudaGraphTraining, PaddedMoeWithGraphsMatchesEagerTraining) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_cuda_graph_moe_" + std::to_string(::getpid()));
  for (bool deepseek : {false, true}) {
    SCOPED_TRACE(deepseek ? "sigmoid + groups + expert bias + seq_aux_loss" : "softmax + aux loss + z-loss");
    Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
    c.model.num_moe_experts = 4;
    c.model.moe_router_topk = 2;
    c.model.moe_ffn_hidden_size = 256;
    c.model.moe_aux_loss_coeff = 0.01f;
    c.model.moe_expert_capacity_factor = 1.0;
    c.model.moe_pad_expert_input_to_capacity = true;
    if (deepseek) {
      c.model.moe_router_score_function = "sigmoid";
      c.model.moe_router_num_groups = 2;
      c.model.moe_router_group_topk = 1;
      c.model.moe_router_enable_expert_bias = true;
      c.model.moe_router_bias_update_rate = 0.05f;
      c.model.moe_router_load_balancing_type = "seq_aux_loss";
    } else {
      c.model.moe_z_loss_coeff = 0.001f;
    }
    c.training.log_interval = 1;
    c.validate();
    const std::string tag = deepseek ? "_deepseek" : "_switch";  // the metrics files append: one per run
    c.training.metrics_path = (dir / ("eager" + tag + ".jsonl")).string();
    const TrainSummary eager = Trainer(c, 99, training_test::single()).train();
    const TrainSummary graphed = training_test::train_graphed(c, (dir / ("graphed" + tag + ".jsonl")).string());
    ASSERT_EQ(graphed.losses.size(), 8u);
    EXPECT_EQ(graphed.cuda_graph_replays, 6);
    for (size_t i = 0; i < 8; ++i)
      EXPECT_NEAR(graphed.losses[i], eager.losses[i], 1e-5 * eager.losses[i]) << "iteration " << i + 1;
    const auto want = router_losses((dir / ("eager" + tag + ".jsonl")).string());
    const auto got = router_losses((dir / ("graphed" + tag + ".jsonl")).string());
    ASSERT_EQ(want.size(), 8u);
    ASSERT_EQ(got.size(), 8u);
    for (size_t i = 0; i < 8; ++i) {
      EXPECT_GT(want[i].first, 0.0) << "no load-balancing loss logged (-1): iteration " << i + 1;
      EXPECT_NEAR(got[i].first, want[i].first, 1e-4 * want[i].first) << "iteration " << i + 1;
      EXPECT_NEAR(got[i].second, want[i].second, 1e-4 * std::abs(want[i].second)) << "iteration " << i + 1;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mcpp::cuda_test
