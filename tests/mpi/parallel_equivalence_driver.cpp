// Parallel equivalence under mpiexec: the same weights and global batch at TP = world size (SP on and
// off, SP with --tp-comm-overlap's ring all-gathers) against the single-rank model built on every rank
// with a size-1 communicator. Checks the loss, the whole-vocabulary logits, every parameter gradient (this
// rank's shard of the reference gradient) and the parameters after 3 AdamW steps with gradient clipping,
// for the GPT-2 and Llama styles; and which TP collectives carried the SP all-gathers (flight recorder).
// Expected values come from the reference run, never from constants tied to one world size.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/comm/mpi/mpi_communicator.h"
#include "tests/mpi/mpi_test_util.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/tensor_parallel/mappings.h"

namespace mcpp {
namespace {

using testing::adam_params;
using testing::rel_err;
using testing::shard_of;

using parallel_state::ParallelContext;

TransformerConfig config_for(const std::string& style) { return testing::equivalence_config(style); }

struct Batch {
  Tensor tokens, labels, mask;
};
Batch batch_for(int step, int64_t s, int64_t b) {
  Batch bt{Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b}, DType::I32), Tensor::empty({s, b})};
  for (int64_t i = 0; i < s * b; ++i) {
    bt.tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 11 + step * 13) % 100);
    bt.labels.data<int32_t>()[i] = static_cast<int32_t>((i * 53 + 5 + step * 7) % 100);
    bt.mask.data<float>()[i] = (i % 5 == 2) ? 0.0f : 1.0f;
  }
  return bt;
}

// The single-rank reference model (a size-1 communicator on every rank) and its twin at TP = world size, built from
// one config and seed.
struct TpPair {
  ParallelContext pc, single;
  ModelChunk ref, par;
  TpPair(const TransformerConfig& c, bool sequence_parallel, bool comm_overlap = false)
      : pc(ParallelContext::create(comm::world(), {.tensor_model_parallel_size = comm::world()->size()})),
        single(ParallelContext::single(comm::make_local_world())),
        ref(c, 42, {single.tp(), false}),
        par(c, 42, {pc.tp(), sequence_parallel, comm_overlap}) {}

  // Both models' evaluation-mode forward of step's batch (main grads zeroed first); the contexts keep what the
  // backward needs.
  void forward(int step, GPTModelCtx& rc, GPTModelCtx& pcx, LossResult& rl, LossResult& pl) {
    Batch bt = batch_for(step, ref.config().seq_length, 2);
    ref.params().zero_grad();
    par.params().zero_grad();
    rl = ref.forward_loss(rc, bt.tokens, bt.labels, bt.mask, {.training = false});
    pl = par.forward_loss(pcx, bt.tokens, bt.labels, bt.mask, {.training = false});
  }
  // Both backwards, then finalize_model_grads (the TP reductions of replicated parameters' grads).
  void backward(GPTModelCtx& rc, GPTModelCtx& pcx) {
    const bool tied = !ref.config().untie_embeddings_and_output_weights;
    ref.backward(rc, 1.0f);
    par.backward(pcx, 1.0f);
    finalize_model_grads(par.params(), pc, tied);
    finalize_model_grads(ref.params(), single, tied);
  }
  // Every parameter's main grad against this rank's shard of the reference's (normwise, rel_err).
  void expect_grads_near(double tol, const std::string& what) {
    for (const auto& p : par.params().params()) {
      const Parameter* r = ref.params().find(p->spec.key);
      ASSERT_NE(r, nullptr) << p->spec.key;
      EXPECT_LT(rel_err(p->main_grad, shard_of(*p, r->main_grad)), tol) << what << " grad " << p->spec.key;
    }
  }
};

void check_tp_equivalence(const std::string& style, bool sequence_parallel, bool comm_overlap = false,
                          bool qk_layernorm = false) {
  comm::CommPtr world = comm::world();
  TransformerConfig c = config_for(style);
  c.qk_layernorm = qk_layernorm;
  TpPair m(c, sequence_parallel, comm_overlap);
  ParallelContext &pc = m.pc, &single = m.single;
  ModelChunk &ref = m.ref, &par = m.par;
  // eps 1e-4 rather than 1e-8: some gradients are exactly zero in exact arithmetic (the key bias — softmax
  // is invariant to it) and are rounding noise (~1e-9) whose sign depends on the reduction order; with a
  // tiny eps Adam would turn that noise into full learning-rate steps of either sign on both sides.
  const AdamOptions adam{.eps = 1e-4f, .weight_decay = 0.1f};
  Adam ref_opt(adam_params(ref.params()), adam);
  Adam par_opt(adam_params(par.params()), adam);
  const std::string what = style + (sequence_parallel ? " SP" : "") + (comm_overlap ? " tp-comm-overlap" : "") +
                           (qk_layernorm ? " qk-layernorm" : "") + " tp=" + std::to_string(world->size());

  for (int step = 0; step < 3; ++step) {
    GPTModelCtx rc, pcx;
    LossResult rl, pl;
    m.forward(step, rc, pcx, rl, pl);
    // fp32 with different reduction orders over TP: 1e-5 relative (DESIGN.md's parallel-equivalence bound).
    EXPECT_NEAR(pl.loss, rl.loss, 1e-5 * std::abs(rl.loss)) << what << " step " << step;
    if (step == 0) {
      Tensor all = par.gather_logits(pcx.logits);
      EXPECT_LT(rel_err(all, rc.logits), 1e-5) << what << " logits";
    }
    m.backward(rc, pcx);
    if (step == 0) m.expect_grads_near(1e-5, what);  // the same 1e-5 bound
    const double rn = model_grad_norm(ref.params(), single), pn = model_grad_norm(par.params(), pc);
    EXPECT_NEAR(pn, rn, 1e-5 * rn) << what << " grad norm step " << step;
    clip_grads_by_total_norm(ref.params(), rn, 0.5);  // small max_norm: clipping is exercised
    clip_grads_by_total_norm(par.params(), pn, 0.5);
    ref_opt.step(1e-2f);
    par_opt.step(1e-2f);
  }
  for (const auto& p : par.params().params()) {
    const Parameter* r = ref.params().find(p->spec.key);
    // Adam divides each gradient by its own running RMS, so a grad difference at the 1e-5 level checked above
    // reaches the parameters undamped; a bias that started at 0 holds only ~3 lr of updates, so its normwise
    // error is that of its grads (1.0-1.2e-5 on OpenBLAS's Haswell / Zen kernels, < 1e-5 on SkylakeX): 3e-5.
    EXPECT_LT(rel_err(p->data, shard_of(*p, r->data)), 3e-5) << what << " param after 3 steps " << p->spec.key;
  }
  // Which collectives carried the SP all-gathers: the TP group's flight recorder (the ring is P2P).
  int64_t p2p = 0, gathers = 0;
  for (const auto& e : pc.tp()->recorder()->entries()) {
    if (e.group != pc.tp()->name()) continue;
    p2p += e.op == "batch_p2p";
    gathers += e.op == "all_gather";
  }
  if (comm_overlap) {
    EXPECT_GT(p2p, 0) << what << ": no ring steps recorded";
  } else {
    EXPECT_EQ(p2p, 0) << what;
    if (sequence_parallel) {
      EXPECT_GT(gathers, 0) << what;
    }
  }
}

// Model-parallel RNG tracker: hidden dropout on replicated activations (no SP) draws from the default
// stream, identical on every TP rank — so TP2 with dropout equals the single-rank run with the same seed;
// the model-parallel stream (attention probabilities of local heads, SP shards) differs per TP rank.
TEST(TensorParallel, DropoutIdenticalWhereReplicatedIndependentWhereSharded) {
  comm::CommPtr world = comm::world();
  TransformerConfig c = config_for("gpt2");
  c.hidden_dropout = 0.2f;
  TpPair m(c, false);
  ParallelContext& pc = m.pc;
  ModelChunk &ref = m.ref, &par = m.par;
  tensor_parallel::RngTracker ref_rng(7, 0, 0), par_rng(7, pc.tp_rank(), 0);
  Batch bt = batch_for(0, c.seq_length, 2);
  GPTModelCtx rc, pcx;
  LossResult rl = ref.forward_loss(rc, bt.tokens, bt.labels, bt.mask, {.training = true, .rng = &ref_rng});
  LossResult pl = par.forward_loss(pcx, bt.tokens, bt.labels, bt.mask, {.training = true, .rng = &par_rng});
  LossResult no_drop = ref.forward_loss(rc, bt.tokens, bt.labels, bt.mask, {.training = false});
  EXPECT_NE(rl.loss, no_drop.loss);  // dropout is active
  EXPECT_NEAR(pl.loss, rl.loss, 1e-5 * std::abs(rl.loss));
  // The streams themselves: default keys agree over TP, model-parallel keys differ.
  tensor_parallel::RngTracker t(7, pc.tp_rank(), 0);
  Tensor keys = Tensor::empty({2 * world->size()}, DType::I64), mine = Tensor::empty({2}, DType::I64);
  mine.data<int64_t>()[0] = static_cast<int64_t>(t.draw_default(10).seed);
  mine.data<int64_t>()[1] = static_cast<int64_t>(t.draw_model_parallel(10).seed);
  pc.tp()->all_gather(keys, mine).wait();
  for (int r = 1; r < world->size(); ++r) {
    EXPECT_EQ(keys.data<int64_t>()[2 * r], keys.data<int64_t>()[0]);
    EXPECT_NE(keys.data<int64_t>()[2 * r + 1], keys.data<int64_t>()[1]);
  }
}

// The ring forms of the SP collectives (--tp-comm-overlap) against the collectives they replace, on this
// world as the TP group: the ring all-gather hands every chunk to the callback once, own chunk first then
// the previous ranks' (rank, rank-1, ...), and returns the all-gather; the ring reduce-scatter asks for
// chunks rank-1, rank-2, ..., rank and returns this rank's chunk of the sum of every rank's partial.
TEST(TensorParallel, RingAllGatherAndReduceScatterEqualTheCollectives) {
  comm::CommPtr world = comm::world();
  const int n = world->size(), r = world->rank();
  const Shape chunk{3, 2, 5};  // [s/tp, b, h]
  Tensor x = Tensor::empty(chunk);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(100 * r + i);
  std::vector<int> order;
  Tensor ring = tensor_parallel::all_gather_sp_ring(*world, x, [&](int c, const Tensor& rows) {
    order.push_back(c);
    EXPECT_EQ(rows.data<float>()[0], static_cast<float>(100 * c)) << "chunk " << c << " is not rank " << c << "'s";
  });
  std::vector<int> want_order;
  for (int k = 0; k < n; ++k) want_order.push_back((r - k + n) % n);
  EXPECT_EQ(order, want_order);
  Tensor gathered = tensor_parallel::all_gather_sp(*world, x);
  EXPECT_EQ(rel_err(ring, gathered), 0.0);

  // Every rank's partial of chunk c: a function of (rank, c, i), so the expected sum is the collective's.
  auto value = [](int rank, int c, int64_t i) { return 0.5f * static_cast<float>(rank + 1) + 0.01f * (c * 7 + i); };
  Tensor full = Tensor::empty({chunk[0] * n, chunk[1], chunk[2]});
  for (int c = 0; c < n; ++c)
    for (int64_t i = 0; i < x.numel(); ++i) full.data<float>()[c * x.numel() + i] = value(r, c, i);
  Tensor want = tensor_parallel::reduce_scatter_sp(*world, full);
  order.clear();
  Tensor got = tensor_parallel::reduce_scatter_sp_ring(*world, chunk, DType::F32, Device::CPU, [&](int c, Tensor& out) {
    order.push_back(c);
    for (int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] = value(r, c, i);
  });
  want_order.clear();
  for (int k = 0; k < n; ++k) want_order.push_back((r - k - 1 + 2 * n) % n);
  EXPECT_EQ(order, want_order);
  EXPECT_EQ(got.shape(), chunk);
  EXPECT_LT(rel_err(got, want), 1e-6);  // the same sum in another order
}

TEST(TensorParallel, Gpt2MatchesSingleRank) { check_tp_equivalence("gpt2", false); }
TEST(TensorParallel, Gpt2SequenceParallelMatchesSingleRank) { check_tp_equivalence("gpt2", true); }
TEST(TensorParallel, LlamaMatchesSingleRank) { check_tp_equivalence("llama", false); }
TEST(TensorParallel, LlamaSequenceParallelMatchesSingleRank) { check_tp_equivalence("llama", true); }
// --qk-layernorm: each TP rank normalizes its own heads with the replicated [hn] weights, so their grads are
// partial sums that finalize_model_grads adds over TP — without SP too (the grads and the weights after 3
// steps equal the single rank's). RMSNorm: a LayerNorm's k bias has a zero gradient (rounding noise).
TEST(TensorParallel, LlamaQkLayernormMatchesSingleRank) { check_tp_equivalence("llama", false, false, true); }
TEST(TensorParallel, LlamaQkLayernormSequenceParallelMatchesSingleRank) {
  check_tp_equivalence("llama", true, false, true);
}
// Multi-latent attention: the column-parallel down projections' gathers (and the SP scatter after them), the
// latent norms' grads (partial under SP only), the shared rotary key's gradient summed over the ranks' heads.
TEST(TensorParallel, MlaMatchesSingleRank) { check_tp_equivalence("mla", false, false, true); }
TEST(TensorParallel, MlaSequenceParallelMatchesSingleRank) { check_tp_equivalence("mla", true, false, true); }
TEST(TensorParallel, MlaNoQueryCompressionMatchesSingleRank) { check_tp_equivalence("mla_noq", false); }
TEST(TensorParallel, MlaNoQueryCompressionSequenceParallelMatchesSingleRank) {
  check_tp_equivalence("mla_noq", true);
}
// FP8 linears (--fp8-format hybrid, delayed scaling; tensor_parallel/fp8_state.h): with each new amax all-reduced
// (max) over TP, every rank casts with the scales of the unsplit tensors — the weights' scales equal the single rank's
// bit for bit (the max of the shards' maxima), the activations' and gradients' within their fp32 reduction-order
// noise — so the TP run follows the single-rank FP8 run up to that noise (a rounding flip moves one element by an
// fp8 quantum): loss and gradients compared loosely.
void check_fp8_tp_equivalence(const std::string& style, bool sequence_parallel) {
  TransformerConfig c = config_for(style);
  c.fp8_format = "hybrid";
  c.fp8_amax_history_len = 4;
  c.fp8_amax_compute_algo = "max";
  TpPair m(c, sequence_parallel);
  const std::string what =
      style + " fp8" + (sequence_parallel ? " SP" : "") + " tp=" + std::to_string(comm::world()->size());
  for (int step = 0; step < 3; ++step) {
    GPTModelCtx rc, pcx;
    LossResult rl, pl;
    m.forward(step, rc, pcx, rl, pl);
    // an fp8 rounding flip moves one element by a quantum: loss 1e-4, grads 1e-3 (normwise)
    EXPECT_NEAR(pl.loss, rl.loss, 1e-4 * std::abs(rl.loss)) << what << " step " << step;
    m.backward(rc, pcx);
    m.expect_grads_near(1e-3, what);
  }
  const auto& rs = m.ref.params().rank_states();
  const auto& ps = m.par.params().rank_states();
  ASSERT_EQ(rs.size(), ps.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    ASSERT_EQ(rs[i].first, ps[i].first);
    if (!rs[i].first.ends_with(".scale")) continue;
    const float want = rs[i].second->data<float>()[0], got = ps[i].second->data<float>()[0];
    if (rs[i].first.find(".fp8.weight.") != std::string::npos) EXPECT_EQ(got, want) << what << " " << rs[i].first;
    else EXPECT_NEAR(got, want, 1e-4 * want) << what << " " << rs[i].first;
  }
}
TEST(TensorParallel, Gpt2Fp8MatchesSingleRank) { check_fp8_tp_equivalence("gpt2", false); }
TEST(TensorParallel, LlamaFp8SequenceParallelMatchesSingleRank) { check_fp8_tp_equivalence("llama", true); }
// Without SP the norms ride in linear_qkv's and fc1's casts (RMSNorm here; gpt2 above: LayerNorm), SwiGLU in fc2's.
TEST(TensorParallel, LlamaFp8MatchesSingleRank) { check_fp8_tp_equivalence("llama", false); }
// --tp-comm-overlap: the SP all-gathers as rings with the GEMM per chunk (fc1 GELU fused and SwiGLU paths,
// the output layer, the dgrad of the row-parallel layers).
TEST(TensorParallel, Gpt2SequenceParallelCommOverlapMatchesSingleRank) { check_tp_equivalence("gpt2", true, true); }
TEST(TensorParallel, LlamaSequenceParallelCommOverlapMatchesSingleRank) { check_tp_equivalence("llama", true, true); }
TEST(TensorParallel, MlaSequenceParallelCommOverlapMatchesSingleRank) { check_tp_equivalence("mla", true, true, true); }
// (the ring tests last: the TP group's flight recorder keeps their P2P entries for the checks of later tests)

}  // namespace
}  // namespace mcpp

int main(int argc, char** argv) { return mcpp::testing::run_mpi_gtest(argc, argv); }
