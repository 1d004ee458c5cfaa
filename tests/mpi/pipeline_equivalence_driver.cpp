// Pipeline-parallel equivalence under mpiexec: PP = world (and TP2 x PP2 on 4 ranks) running Megatron's
// schedules (1F1B, interleaved) against the single-rank model built on every rank with the same seed and
// global batch. Checks the loss, every parameter gradient on the stage that holds it (tied embeddings:
// after the embedding-group all-reduce, equal on both ends), the parameters after 3 AdamW steps, and the
// activations held per stage against the schedule's in-flight count (and the peak activation bytes =
// in-flight x one context's bytes, exactly: every microbatch has the same shapes, no storage is shared
// between microbatches) — for M = 1, pp and 4 * pp, uneven layouts, and both model styles.
// Also: activation recompute (full uniform / block, selective; with TP2 x PP2 + SP on 4 ranks) on vs off
// bitwise equal with hidden + attention dropout (same parallel layout, same RNG streams);
// --calculate-per-token-loss with loss masks that differ between microbatches equal to one microbatch
// over the whole global batch on one rank; variable sequence lengths (shape exchange) equal to one rank.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/comm/mpi/mpi_communicator.h"
#include "tests/mpi/mpi_test_util.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/pipeline_parallel/layout.h"
#include "mcpp/pipeline_parallel/schedule_runner.h"

namespace mcpp {
namespace {

using testing::rel_err;
using testing::shard_of;

using parallel_state::ParallelContext;
namespace pp = pipeline_parallel;

TransformerConfig config_for(const std::string& style, int64_t layers) {
  return testing::equivalence_config(style, layers);
}

// vary_mask: the masked positions (and their count) differ between microbatches.
pp::MicroBatch micro(int step, int64_t m, int64_t s, int64_t b, bool vary_mask = false) {
  pp::MicroBatch bt{Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b})};
  for (int64_t i = 0; i < s * b; ++i) {
    bt.tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11 + step * 13 + m * 29) % 100);
    bt.labels.data<int32_t>()[i] = static_cast<int32_t>((i * 53 + 5 + step * 7 + m * 17) % 100);
    const bool masked = vary_mask ? (i < (m % 4) * 3 || i % (2 + m % 3) == 1) : (i % 5 == 2);
    bt.loss_mask.data<float>()[i] = masked ? 0.0f : 1.0f;
  }
  return bt;
}

ParallelContext make_pc(int tp) {
  comm::CommPtr world = comm::world();
  return ParallelContext::create(world,
                                 parallel_state::ParallelOptions{.tensor_model_parallel_size = tp,
                                                                 .pipeline_model_parallel_size = world->size() / tp,
                                                                 .pipeline_model_parallel_layout = {}});
}

// Finalizes this rank's chunks' grads (DP / embedding-group all-reduces) and checks every parameter's main
// grad against its shard of the single-rank reference (1e-5 relative) when `check`.
void finalize_and_expect_grads(std::vector<std::unique_ptr<ModelChunk>>& chunks, ModelChunk& ref,
                               const ParallelContext& pc, const TransformerConfig& c, const std::string& what,
                               bool check = true) {
  std::vector<ParamAndGradBuffer*> bufs;
  for (auto& ch : chunks) bufs.push_back(&ch->params());
  finalize_model_grads(bufs, pc, !c.untie_embeddings_and_output_weights);
  for (auto& ch : chunks)
    for (const auto& p : ch->params().params()) {
      const Parameter* r = ref.params().find(p->spec.key);
      EXPECT_NE(r, nullptr) << what << ": no reference for " << p->spec.key;
      if (check && r) {
        EXPECT_LT(rel_err(p->main_grad, shard_of(*p, r->main_grad)), 1e-5) << what << " grad " << p->spec.key;
      }
    }
}

// This rank's model chunks (one per virtual stage) for an even layout with V virtual stages.
std::vector<std::unique_ptr<ModelChunk>> make_chunks(const TransformerConfig& c, const ParallelContext& pc, int64_t V,
                                                   bool sequence_parallel = false) {
  const int64_t ppsize = pc.pp_size();
  const pp::PipelineLayout layout = pp::make_pipeline_layout(
      {.num_layers = c.num_layers,
       .pipeline_model_parallel_size = ppsize,
       .num_layers_per_virtual_pipeline_stage = V > 1 ? c.num_layers / (ppsize * V) : 0});
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  for (int64_t v = 0; v < layout.virtual_pipeline_model_parallel_size; ++v) {
    const pp::StageLayers& st = layout.at(pc.pp_rank(), v);
    chunks.push_back(std::make_unique<ModelChunk>(
        c, 42, tensor_parallel::TPContext{pc.tp(), sequence_parallel}, Device::CPU,
        GPTModelStage{st.pre_process, st.post_process, st.layers.empty() ? 0 : st.layers.front(),
                      static_cast<int64_t>(st.layers.size())}));
  }
  return chunks;
}



struct Case {
  std::string style;
  int64_t layers = 4;
  int tp = 1;
  int64_t microbatches = 1;
  int64_t virtual_stages = 1;     // via num_layers_per_virtual_pipeline_stage
  int64_t first_stage_layers = -1;  // uneven split
};

void check(const Case& k) {
  comm::CommPtr world = comm::world();
  const int ppsize = world->size() / k.tp;
  ParallelContext pc = ParallelContext::create(
      world, parallel_state::ParallelOptions{.tensor_model_parallel_size = k.tp,
                                             .pipeline_model_parallel_size = ppsize,
                                             .pipeline_model_parallel_layout = {}});
  ParallelContext single = ParallelContext::single(comm::make_local_world());
  const TransformerConfig c = config_for(k.style, k.layers);
  const std::string what = fmt::format("{} L{} tp{} pp{} M{} V{} first{}", k.style, k.layers, k.tp, ppsize,
                                       k.microbatches, k.virtual_stages, k.first_stage_layers);
  pp::LayoutOptions lo{.num_layers = k.layers,
                       .pipeline_model_parallel_size = ppsize,
                       .num_layers_per_virtual_pipeline_stage = k.virtual_stages > 1 ? k.layers / (ppsize * k.virtual_stages) : 0,
                       .decoder_first_pipeline_num_layers = k.first_stage_layers};
  const pp::PipelineLayout layout = pp::make_pipeline_layout(lo);
  std::vector<std::unique_ptr<ModelChunk>> chunks;
  for (int64_t v = 0; v < layout.virtual_pipeline_model_parallel_size; ++v) {
    const pp::StageLayers& st = layout.at(pc.pp_rank(), v);
    chunks.push_back(std::make_unique<ModelChunk>(
        c, 42, tensor_parallel::TPContext{pc.tp(), false}, Device::CPU,
        GPTModelStage{st.pre_process, st.post_process, st.layers.empty() ? 0 : st.layers.front(),
                      static_cast<int64_t>(st.layers.size())}));
  }
  ModelChunk ref(c, 42, {single.tp(), false});
  const AdamOptions adam{.eps = 1e-4f, .weight_decay = 0.1f};  // eps: see parallel_equivalence_driver.cpp
  std::vector<AdamParam> ap, rp;
  std::vector<ParamAndGradBuffer*> bufs;
  for (auto& ch : chunks) {
    bufs.push_back(&ch->params());
    for (const auto& p : ch->params().params())
      ap.push_back({.name = p->spec.key + (p->spec.shared_copy ? "#copy" : ""), .param = p->data,
                    .main_grad = p->main_grad, .no_weight_decay = p->spec.no_weight_decay});
  }
  for (const auto& p : ref.params().params())
    rp.push_back({.name = p->spec.key, .param = p->data, .main_grad = p->main_grad, .no_weight_decay = p->spec.no_weight_decay});
  Adam par_opt(ap, adam), ref_opt(rp, adam);
  const pp::ScheduleOptions so{.pipeline_model_parallel_size = ppsize,
                               .pipeline_model_parallel_rank = pc.pp_rank(),
                               .num_microbatches = k.microbatches,
                               .virtual_pipeline_model_parallel_size = layout.virtual_pipeline_model_parallel_size};
  const pp::Schedule sched = pp::build_schedule(so);
  const int64_t M = k.microbatches, b = 2;
  for (int step = 0; step < 3; ++step) {
    for (auto* bf : bufs) bf->zero_grad();
    ref.params().zero_grad();
    double ref_loss = 0;
    for (int64_t m = 0; m < M; ++m) {
      pp::MicroBatch mb = micro(step, m, c.seq_length, b);
      GPTModelCtx ctx;
      ref_loss += ref.forward_loss(ctx, mb.tokens, mb.labels, mb.loss_mask, {.training = false}).loss / M;
      ref.backward(ctx, 1.0f / static_cast<float>(M));
    }
    pp::ScheduleRunArgs args{.schedule = &sched,
                             .pc = &pc,
                             .get_batch = [&](int64_t m) { return micro(step, m, c.seq_length, b); },
                             .hidden_shape = {c.seq_length, b, c.hidden_size},
                             .forward = {.training = false},
                             .grad_scale = 1.0f / static_cast<float>(M),
                             .forward_only = false,
                             .before_backward = {}};
    for (auto& ch : chunks) args.chunks.push_back(ch.get());
    pp::ScheduleRunResult res = pp::run_schedule(args);
    if (pc.is_pipeline_last_stage()) {
      EXPECT_NEAR(pp::loss_totals(res.loss_stats).loss_sum / M, ref_loss, 1e-5 * ref_loss) << what << " step " << step;
    }
    if (step == 0) {
      EXPECT_EQ(res.max_in_flight, pp::max_activations_in_flight(so)) << what << " activations in flight";
      if (layout.virtual_pipeline_model_parallel_size == 1) {
        // 1F1B: pp - rank contexts live at once (warmup pp - rank - 1, then one more), at most M.
        EXPECT_EQ(res.max_in_flight, std::min<int64_t>(M, ppsize - pc.pp_rank())) << what;
        // Every microbatch has the same shapes and no storage is shared between them: exact.
        EXPECT_EQ(res.peak_activation_bytes, static_cast<size_t>(res.max_in_flight) * res.max_context_bytes) << what;
      } else {  // chunks differ (the last stage's logits): bounded by in-flight x the largest context
        const int64_t V = layout.virtual_pipeline_model_parallel_size;  // Megatron's interleaved warmup + 1
        EXPECT_EQ(res.max_in_flight, std::min<int64_t>((ppsize - pc.pp_rank() - 1) * 2 + (V - 1) * ppsize + 1, M * V))
            << what;
        EXPECT_LE(res.peak_activation_bytes, static_cast<size_t>(res.max_in_flight) * res.max_context_bytes) << what;
      }
      EXPECT_GT(res.max_context_bytes, 0u) << what;
    }
    finalize_and_expect_grads(chunks, ref, pc, c, what, /*check=*/step == 0);
    const double rn = model_grad_norm(ref.params(), single), pn = model_grad_norm(bufs, pc);
    EXPECT_NEAR(pn, rn, 1e-5 * rn) << what << " grad norm";
    clip_grads_by_total_norm(ref.params(), rn, 0.5);
    for (auto* bf : bufs) clip_grads_by_total_norm(*bf, pn, 0.5);
    ref_opt.step(1e-2f);
    par_opt.step(1e-2f);
  }
  for (auto& ch : chunks)
    for (const auto& p : ch->params().params())
      EXPECT_LT(rel_err(p->data, shard_of(*p, ref.params().find(p->spec.key)->data)), 1e-5)
          << what << " param after 3 steps " << p->spec.key << (p->spec.shared_copy ? " (tied copy)" : "");
}

// Runs one training step of the schedule with dropout (the RNG streams of this rank, fresh) and returns the
// last stage's loss sum and this rank's gradients (every chunk's grad buffer, concatenated).
struct StepOut {
  double loss = 0;
  std::vector<Tensor> grads;
  size_t context_bytes = 0;
};

StepOut dropout_step(const TransformerConfig& c, const ParallelContext& pc, int64_t V, int64_t M, bool sp) {
  auto chunks = make_chunks(c, pc, V, sp);
  const pp::Schedule sched = pp::build_schedule({.pipeline_model_parallel_size = pc.pp_size(),
                                                 .pipeline_model_parallel_rank = pc.pp_rank(),
                                                 .num_microbatches = M,
                                                 .virtual_pipeline_model_parallel_size = V});
  tensor_parallel::RngTracker rng(1234, pc.tp_rank(), pc.pp_rank());
  const int64_t b = 2;
  pp::ScheduleRunArgs args{.schedule = &sched,
                           .pc = &pc,
                           .get_batch = [&](int64_t m) { return micro(0, m, c.seq_length, b); },
                           .hidden_shape = {c.seq_length / (sp ? pc.tp_size() : 1), b, c.hidden_size},
                           .forward = {.training = true, .rng = &rng},
                           .grad_scale = 1.0f / static_cast<float>(M),
                           .forward_only = false,
                           .before_backward = {}};
  for (auto& ch : chunks) args.chunks.push_back(ch.get());
  const pp::ScheduleRunResult res = pp::run_schedule(args);
  StepOut out{pp::loss_totals(res.loss_stats).loss_sum, {}, res.max_context_bytes};
  for (auto& ch : chunks) out.grads.push_back(ch->params().grad_buffer().clone());
  return out;
}

void check_recompute(const std::string& style, int tp, bool sp, int64_t V) {
  ParallelContext pc = make_pc(tp);
  const int64_t M = 2 * pc.pp_size(), L = 2 * pc.pp_size() * V;
  TransformerConfig off = config_for(style, L);
  off.hidden_dropout = 0.1f;
  off.attention_dropout = 0.2f;
  off.attention_impl = "unfused";
  const StepOut ref = dropout_step(off, pc, V, M, sp);
  struct Mode {
    std::string granularity, method;
    int64_t n;
  };
  for (const Mode& mode : {Mode{"full", "uniform", 1}, Mode{"full", "uniform", 2}, Mode{"full", "block", 1},
                           Mode{"selective", "", 0}}) {
    TransformerConfig c = off;
    c.recompute_granularity = mode.granularity;
    c.recompute_method = mode.method;
    c.recompute_num_layers = mode.n;
    c.validate();
    const std::string what = fmt::format("{} tp{} sp{} pp{} V{} recompute {} {} {}", style, tp, sp, pc.pp_size(), V,
                                         mode.granularity, mode.method, mode.n);
    const StepOut got = dropout_step(c, pc, V, M, sp);
    EXPECT_EQ(got.loss, ref.loss) << what << ": loss must be bitwise equal";
    ASSERT_EQ(got.grads.size(), ref.grads.size());
    for (size_t i = 0; i < got.grads.size(); ++i)
      EXPECT_EQ(0, std::memcmp(got.grads[i].raw(), ref.grads[i].raw(), ref.grads[i].nbytes()))
          << what << ": chunk " << i << " gradients must be bitwise equal";
    EXPECT_LT(got.context_bytes, ref.context_bytes) << what << ": activation bytes per microbatch must shrink";
  }
}

TEST(Pipeline, RecomputeBitwiseEqualWithDropout) {
  const int world = comm::world()->size();
  check_recompute("gpt2", 1, false, 1);
  check_recompute("llama", 1, false, 1);
  if (world >= 2) check_recompute("gpt2", 1, false, 2);  // interleaved: each chunk's own plan
  if (world == 4) {
    check_recompute("gpt2", 2, true, 1);  // TP2 x PP2 + SP: sharded dropout from the model-parallel stream
    check_recompute("llama", 2, false, 1);
  }
}

// --calculate-per-token-loss: the PP run back-propagates each microbatch's token sum (grad_scale 1) and
// divides the gradients by the token count over all microbatches (summed over the PP group: only the
// last stage has it), as the trainer does; the reference is ONE microbatch made of the whole global batch
// on one rank (mean over all non-masked tokens). Masks differ between microbatches, so this differs from
// the default mean of per-microbatch means.
void check_per_token(const std::string& style, int64_t M, int64_t V) {
  ParallelContext pc = make_pc(1);
  ParallelContext single = ParallelContext::single(comm::make_local_world());
  TransformerConfig c = config_for(style, 2 * pc.pp_size() * V);
  TransformerConfig per_token = c;
  per_token.calculate_per_token_loss = true;
  auto chunks = make_chunks(per_token, pc, V);
  ModelChunk ref(c, 42, {single.tp(), false});
  const int64_t s = c.seq_length, b = 2;
  // The global batch as one microbatch [s, M*b]: column m*b + ib is microbatch m's column ib.
  pp::MicroBatch global{Tensor::empty({s, M * b}, DType::I32), Tensor::empty({s, M * b}, DType::I32),
                        Tensor::empty({s, M * b})};
  double mean_of_means = 0;
  for (int64_t m = 0; m < M; ++m) {
    pp::MicroBatch mb = micro(0, m, s, b, /*vary_mask=*/true);
    for (int64_t i = 0; i < s; ++i)
      for (int64_t ib = 0; ib < b; ++ib) {
        global.tokens.data<int32_t>()[i * M * b + m * b + ib] = mb.tokens.data<int32_t>()[i * b + ib];
        global.labels.data<int32_t>()[i * M * b + m * b + ib] = mb.labels.data<int32_t>()[i * b + ib];
        global.loss_mask.data<float>()[i * M * b + m * b + ib] = mb.loss_mask.data<float>()[i * b + ib];
      }
    GPTModelCtx ctx;
    mean_of_means += ref.forward_loss(ctx, mb.tokens, mb.labels, mb.loss_mask, {.training = false}).loss / M;
  }
  GPTModelCtx ctx;
  const double ref_loss = ref.forward_loss(ctx, global.tokens, global.labels, global.loss_mask, {.training = false}).loss;
  ref.params().zero_grad();
  ref.backward(ctx, 1.0f);
  const pp::Schedule sched = pp::build_schedule({.pipeline_model_parallel_size = pc.pp_size(),
                                                 .pipeline_model_parallel_rank = pc.pp_rank(),
                                                 .num_microbatches = M,
                                                 .virtual_pipeline_model_parallel_size = V});
  pp::ScheduleRunArgs args{.schedule = &sched,
                           .pc = &pc,
                           .get_batch = [&](int64_t m) { return micro(0, m, s, b, /*vary_mask=*/true); },
                           .hidden_shape = {s, b, c.hidden_size},
                           .forward = {.training = false},
                           .grad_scale = 1.0f,
                           .forward_only = false,
                           .before_backward = {}};
  for (auto& ch : chunks) args.chunks.push_back(ch.get());
  const pp::ScheduleRunResult res = pp::run_schedule(args);
  Tensor sums = Tensor::empty({2});
  const pp::LossTotals totals = pp::loss_totals(res.loss_stats);
  sums.data<float>()[0] = static_cast<float>(totals.masked_loss_sum);
  sums.data<float>()[1] = static_cast<float>(totals.num_tokens);
  pc.pp()->all_reduce(sums, comm::ReduceOp::Sum).wait();
  const double tokens = sums.data<float>()[1];
  const std::string what = fmt::format("{} per-token pp{} M{} V{}", style, pc.pp_size(), M, V);
  EXPECT_NEAR(sums.data<float>()[0] / tokens, ref_loss, 1e-5 * ref_loss) << what;
  // The untrained model's per-token losses are all near ln(V), so the two means differ little; the gap must
  // still exceed the 1e-5 tolerance above, or that check could not tell per-token from per-microbatch.
  EXPECT_GT(std::abs(ref_loss - mean_of_means), 2e-5 * ref_loss) << what << ": masks must make the means differ";
  for (auto& ch : chunks) ops::scale_inplace(ch->params().grad_buffer(), static_cast<float>(1.0 / tokens));
  finalize_and_expect_grads(chunks, ref, pc, c, what);
}

TEST(Pipeline, PerTokenLossEqualsWholeGlobalBatch) {
  const int pp = comm::world()->size();
  check_per_token("gpt2", pp, 1);
  check_per_token("llama", 3 * pp, 1);
  if (pp >= 2) check_per_token("gpt2", 2 * pp, 2);
}

// --variable-seq-lengths: microbatches of different sequence lengths; every P2P transfer is preceded by
// its shape, the receiver allocates from it. Equal to the single-rank model run microbatch by microbatch.
void check_variable_seq(const std::string& style, int64_t V) {
  ParallelContext pc = make_pc(1);
  ParallelContext single = ParallelContext::single(comm::make_local_world());
  const TransformerConfig c = config_for(style, 2 * pc.pp_size() * V);
  auto chunks = make_chunks(c, pc, V);
  ModelChunk ref(c, 42, {single.tp(), false});
  const int64_t M = 2 * pc.pp_size(), b = 2;
  auto seq_of = [&](int64_t m) { return std::vector<int64_t>{8, 5, 12, 3, 16, 7, 1, 10}[static_cast<size_t>(m % 8)]; };
  double ref_loss = 0;
  ref.params().zero_grad();
  for (int64_t m = 0; m < M; ++m) {
    pp::MicroBatch mb = micro(0, m, seq_of(m), b);
    GPTModelCtx ctx;
    ref_loss += ref.forward_loss(ctx, mb.tokens, mb.labels, mb.loss_mask, {.training = false}).loss / M;
    ref.backward(ctx, 1.0f / static_cast<float>(M));
  }
  const pp::Schedule sched = pp::build_schedule({.pipeline_model_parallel_size = pc.pp_size(),
                                                 .pipeline_model_parallel_rank = pc.pp_rank(),
                                                 .num_microbatches = M,
                                                 .virtual_pipeline_model_parallel_size = V});
  pp::ScheduleRunArgs args{.schedule = &sched,
                           .pc = &pc,
                           .get_batch = [&](int64_t m) { return micro(0, m, seq_of(m), b); },
                           .hidden_shape = {},  // unknown: exchanged
                           .variable_seq_lengths = true,
                           .forward = {.training = false},
                           .grad_scale = 1.0f / static_cast<float>(M),
                           .forward_only = false,
                           .before_backward = {}};
  for (auto& ch : chunks) args.chunks.push_back(ch.get());
  const pp::ScheduleRunResult res = pp::run_schedule(args);
  const std::string what = fmt::format("{} variable seq pp{} V{}", style, pc.pp_size(), V);
  if (pc.is_pipeline_last_stage()) {
    EXPECT_NEAR(pp::loss_totals(res.loss_stats).loss_sum / M, ref_loss, 1e-5 * ref_loss) << what;
  }
  finalize_and_expect_grads(chunks, ref, pc, c, what);
}

TEST(Pipeline, VariableSeqLengthsMatchSingleRank) {
  check_variable_seq("gpt2", 1);
  check_variable_seq("llama", 1);
  if (comm::world()->size() >= 2) check_variable_seq("gpt2", 2);
}

TEST(Pipeline, OneF1BMicrobatchCounts) {
  const int pp = comm::world()->size();
  for (int64_t M : {int64_t{1}, int64_t(pp), int64_t(4 * pp)}) check({.style = "gpt2", .layers = pp, .microbatches = M});
  check({.style = "llama", .layers = 2 * pp, .microbatches = pp});
}

TEST(Pipeline, InterleavedMatchesSingleRank) {
  const int pp = comm::world()->size();
  if (pp < 2) GTEST_SKIP() << "needs 2 ranks";
  check({.style = "gpt2", .layers = 4 * pp, .microbatches = 2 * pp, .virtual_stages = 2});
  check({.style = "llama", .layers = 2 * pp, .microbatches = pp, .virtual_stages = 2});
}

TEST(Pipeline, UnevenFirstStage) {
  const int pp = comm::world()->size();
  if (pp < 2) GTEST_SKIP() << "needs 2 ranks";
  check({.style = "gpt2", .layers = 1 + 2 * (pp - 1), .microbatches = pp, .first_stage_layers = 1});
}

TEST(Pipeline, TensorTimesPipeline) {
  if (comm::world()->size() != 4) GTEST_SKIP() << "TP2 x PP2 needs 4 ranks";
  check({.style = "gpt2", .layers = 4, .tp = 2, .microbatches = 4});
  check({.style = "llama", .layers = 4, .tp = 2, .microbatches = 4});
  check({.style = "mla", .layers = 4, .tp = 2, .microbatches = 4});  // multi-latent attention under TP x PP
}

// Multi-latent attention: its layers on every stage, the model's MLA rotary tables on each.
TEST(Pipeline, MultiLatentAttentionMatchesSingleRank) {
  const int pp = comm::world()->size();
  check({.style = "mla", .layers = 2 * pp, .microbatches = 2 * pp});
  if (pp >= 2) check({.style = "mla_noq", .layers = 2 * pp, .microbatches = pp, .virtual_stages = 2});
}

}  // namespace
}  // namespace mcpp

int main(int argc, char** argv) { return mcpp::testing::run_mpi_gtest(argc, argv); }
