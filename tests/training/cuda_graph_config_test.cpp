// --enable-cuda-graph: the flags parse under Megatron's names; what the captured step cannot contain is
// refused at validation naming the reason (expert parallel, dropless MoE, variable P2P shapes, --timeline, --device
// cpu, an unimplemented scope, no warm-up step); without a GPU the trainer refuses it instead of running eagerly.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/training/arguments.h"
#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp {
namespace {

using training_test::error_of;

Config graph_config() {  // the tiny trainer config without dropout, graphs on
  Config c = training_test::tiny_train_config("unused_prefix");
  c.model.hidden_dropout = 0.0f;
  c.model.attention_dropout = 0.0f;
  c.training.enable_cuda_graph = true;
  c.training.device = "auto";  // graphs refuse --device cpu
  c.validate();
  return c;
}

TEST(CudaGraphConfig, MegatronFlagsParse) {
  Config c = parse_train_args({"--enable-cuda-graph", "--cuda-graph-scope", "full_iteration",
                               "--cuda-graph-warmup-steps", "5", "--hidden-dropout", "0", "--attention-dropout", "0"});
  EXPECT_TRUE(c.training.enable_cuda_graph);
  EXPECT_EQ(c.training.cuda_graph_scope, "full_iteration");
  EXPECT_EQ(c.training.cuda_graph_warmup_steps, 5);
  Config d = parse_train_args({});
  EXPECT_FALSE(d.training.enable_cuda_graph);
  EXPECT_EQ(d.training.cuda_graph_warmup_steps, 3);  // Megatron's default
}

TEST(CudaGraphConfig, WhatTheCapturedStepCannotContainIsRefused) {
  Config ok = graph_config();
  EXPECT_EQ(error_of([&] { ok.validate(); }), "");
  auto refused = [&](auto&& edit, const std::string& needle) {
    Config c = ok;
    edit(c);
    const std::string e = error_of([&] { c.validate(); });
    EXPECT_NE(e.find(needle), std::string::npos) << "expected '" << needle << "' in: " << e;
  };
  refused([](Config& c) { c.parallel.expert_model_parallel_size = 2; }, "expert_model_parallel_size");
  refused([](Config& c) { c.parallel.variable_seq_lengths = true; }, "--variable-seq-lengths");
  Config tp2 = ok;  // tensor parallel (+ SP) and pipeline parallel are capturable: all device collectives / P2P
  tp2.parallel.tensor_model_parallel_size = 2;
  tp2.parallel.sequence_parallel = true;
  EXPECT_EQ(error_of([&] { tp2.validate(); }), "");
  Config pp2 = ok;
  pp2.parallel.pipeline_model_parallel_size = 2;
  EXPECT_EQ(error_of([&] { pp2.validate(); }), "");
  Config interleaved = ok;  // the interleaved schedule: its P2P ring is batched NCCL send/recv too
  interleaved.model.num_layers = 8;
  interleaved.parallel.pipeline_model_parallel_size = 4;
  interleaved.parallel.num_layers_per_virtual_pipeline_stage = 1;
  EXPECT_EQ(error_of([&] { interleaved.validate(); }), "");
  Config cp2 = ok;  // context parallel: its all-to-alls are NCCL send/recv and strided device copies
  cp2.parallel.context_parallel_size = 2;
  EXPECT_EQ(error_of([&] { cp2.validate(); }), "");
  Config dropout = ok;  // graph-safe dropout keys (RngTracker::begin_graph_capture)
  dropout.model.hidden_dropout = 0.1f;
  EXPECT_EQ(error_of([&] { dropout.validate(); }), "");
  auto moe = [](Config& c) {
    c.model.num_moe_experts = 4;
    c.model.moe_ffn_hidden_size = c.model.ffn_hidden_size;
    c.model.moe_aux_loss_coeff = 0.01f;
  };
  // MoE: dropless layers size their buffers from counts read on the host; padded to capacity they are fixed
  refused([&](Config& c) { moe(c); }, "--moe-pad-expert-input-to-capacity");
  refused([&](Config& c) { moe(c), c.model.moe_expert_capacity_factor = 1.0; }, "--moe-pad-expert-input-to-capacity");
  Config padded = ok;
  moe(padded);
  padded.model.moe_expert_capacity_factor = 1.0;
  padded.model.moe_pad_expert_input_to_capacity = true;
  EXPECT_EQ(error_of([&] { padded.validate(); }), "");
  // Expert TP (the default under TP: the TP size) is not captured yet; expert TP 1 at TP2 + SP is.
  Config padded_tp2 = padded;
  padded_tp2.parallel.tensor_model_parallel_size = 2;
  padded_tp2.parallel.sequence_parallel = true;
  const std::string etp = error_of([&] { padded_tp2.validate(); });
  EXPECT_NE(etp.find("--expert-tensor-parallel-size 1"), std::string::npos) << etp;
  padded_tp2.parallel.expert_tensor_parallel_size = 1;
  EXPECT_EQ(error_of([&] { padded_tp2.validate(); }), "");
  refused([](Config& c) { c.training.timeline = "trace.json"; }, "--timeline");
  refused([](Config& c) { c.training.device = "cpu"; }, "--device cuda");
  refused([](Config& c) { c.training.cuda_graph_scope = "attn"; }, "cuda_graph_scope");
  refused([](Config& c) { c.training.cuda_graph_warmup_steps = 0; }, "cuda_graph_warmup_steps");
  // Graphs off: the same settings are fine.
  Config off = ok;
  off.training.enable_cuda_graph = false;
  off.training.timeline = "trace.json";
  EXPECT_EQ(error_of([&] { off.validate(); }), "");
}

TEST(CudaGraphConfig, TrainerWithoutAGpuRefusesInsteadOfRunningEagerly) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible: tests/cuda/cuda_graph_test.cpp trains with graphs";
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_graph_cfg_" + std::to_string(::getpid()));
  Config c = graph_config();
  c.data.data_path = {training_test::make_corpus(dir)};
  const std::string e = error_of([&] { Trainer t(c, 99, training_test::single()); });
  std::filesystem::remove_all(dir);
  EXPECT_NE(e.find("enable_cuda_graph"), std::string::npos) << e;
}

}  // namespace
}  // namespace mcpp
