// Pipeline-parallel equivalence under mpiexec: PP = world (and TP2 x PP2 on 4 ranks) running Megatron's
// schedules (1F1B, interleaved) against the single-rank model built on every rank with the same seed and
// global batch. Checks the loss, every parameter gradient on the stage that holds it (tied embeddings:
// after the embedding-group all-reduce, equal on both ends), the parameters after 3 AdamW steps, and the
// activations held per stage against the schedule's in-flight count — for M = 1, pp and 4 * pp, uneven
// layouts, and both model styles.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/comm/mpi/mpi_communicator.h"
#include "tests/mpi/mpi_test_util.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/models/gpt/gpt_model.h"
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

pp::MicroBatch micro(int step, int64_t m, int64_t s, int64_t b) {
  pp::MicroBatch bt{Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b})};
  for (int64_t i = 0; i < s * b; ++i) {
    bt.tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11 + step * 13 + m * 29) % 100);
    bt.labels.data<int32_t>()[i] = static_cast<int32_t>((i * 53 + 5 + step * 7 + m * 17) % 100);
    bt.loss_mask.data<float>()[i] = (i % 5 == 2) ? 0.0f : 1.0f;
  }
  return bt;
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
  std::vector<std::unique_ptr<GPTModel>> chunks;
  for (int64_t v = 0; v < layout.virtual_pipeline_model_parallel_size; ++v) {
    const pp::StageLayers& st = layout.at(pc.pp_rank(), v);
    chunks.push_back(std::make_unique<GPTModel>(
        c, 42, tensor_parallel::TPContext{pc.tp(), false}, Device::CPU,
        GPTModelStage{st.pre_process, st.post_process, st.layers.empty() ? 0 : st.layers.front(),
                      static_cast<int64_t>(st.layers.size())}));
  }
  GPTModel ref(c, 42, {single.tp(), false});
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
      EXPECT_NEAR(res.loss_sum / M, ref_loss, 1e-5 * ref_loss) << what << " step " << step;
    }
    if (step == 0) {
      EXPECT_EQ(res.max_in_flight, pp::max_activations_in_flight(so)) << what << " activations in flight";
    }
    finalize_model_grads(bufs, pc, !c.untie_embeddings_and_output_weights);
    for (auto& ch : chunks)
      for (const auto& p : ch->params().params()) {
        const Parameter* r = ref.params().find(p->spec.key);
        ASSERT_NE(r, nullptr) << p->spec.key;
        if (step == 0) {
          EXPECT_LT(rel_err(p->main_grad, shard_of(*p, r->main_grad)), 1e-5) << what << " grad " << p->spec.key;
        }
      }
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
}

}  // namespace
}  // namespace mcpp

int main(int argc, char** argv) { return mcpp::testing::run_mpi_gtest(argc, argv); }
