// Data-parallel equivalence under mpiexec: DistributedDataParallel (plain Adam or the distributed
// optimizer) at DP = world / tp against the single-rank model built on every rank with a size-1
// communicator and fed the WHOLE global batch. DP rank r gets columns [(r*M + m)*b, +b) of the global
// batch [s, dp*M*b] as its microbatch m (M microbatches, each loss scaled by 1/M, grads averaged over DP).
// The loss mask depends only on the sequence position, so every microbatch has the same token count and
// the mean over ranks of the microbatch means equals the single-rank mean over the global batch.
// Checks per step: loss (mean over DP ranks), every gradient after finish_grad_sync (+ finalize_model_grads)
// — the whole buffer with plain DDP, this rank's shard pieces with the distributed optimizer — the grad
// norm, and after 3 AdamW steps with clipping every parameter. With gradient accumulation the flight
// recorder shows that no dp_cp collective ran before the last microbatch. Both model styles; TP2 x DP2;
// context parallelism (CP ranks take s/cp rows of their DP rank's columns; all-to-all attention). And the
// distributed optimizer with bf16 buffers: fp32 masters only in the shards, bitwise Adam, checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <unistd.h>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/comm/mpi/mpi_communicator.h"
#include "mcpp/core/error.h"
#include "tests/mpi/mpi_test_util.h"
#include "mcpp/distributed/data_parallel.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/training/checkpointing.h"

namespace mcpp {
namespace {

using testing::adam_params;
using testing::rel_err;
using testing::shard_of;

using parallel_state::ParallelContext;

TransformerConfig config_for(const std::string& style) {
  if (style != "gpt2odd") return testing::equivalence_config(style);
  TransformerConfig c = testing::equivalence_config("gpt2");  // sizes not divisible by dp: buckets need padding
  c.hidden_size = 27;
  c.num_attention_heads = 3;
  c.num_query_groups = 3;
  c.kv_channels = 9;
  c.ffn_hidden_size = 45;
  c.padded_vocab_size = 101;
  return c;
}

struct Batch {
  Tensor tokens, labels, mask;  // [s, ncols]
};
// Columns [col0, col0 + ncols) of the global batch of `step`.
Batch batch_cols(int step, int64_t s, int64_t col0, int64_t ncols) {
  Batch bt{Tensor::empty({s, ncols}, DType::I32), Tensor::empty({s, ncols}, DType::I32), Tensor::empty({s, ncols})};
  for (int64_t is = 0; is < s; ++is)
    for (int64_t j = 0; j < ncols; ++j) {
      const int64_t ib = col0 + j, i = is * ncols + j;
      bt.tokens.data<int32_t>()[i] = static_cast<int32_t>((is * 37 + ib * 11 + 5 + step * 13) % 100);
      bt.labels.data<int32_t>()[i] = static_cast<int32_t>((is * 53 + ib * 29 + 3 + step * 7) % 100);
      bt.mask.data<float>()[i] = (is % 5 == 2) ? 0.0f : 1.0f;  // same count in every column
    }
  return bt;
}

struct Case {
  std::string style = "gpt2";
  int tp = 1;
  int cp = 1;  // context parallel (all-to-all attention): each CP rank takes s/cp rows of its DP rank's batch
  bool sequence_parallel = false;
  int64_t bucket_size = 0;
  bool overlap_grad_reduce = false;
  bool distributed_optimizer = false;
  bool overlap_param_gather = false;
  int microbatches = 1;
  bool expect_padding = false;  // assert that some bucket is padded (the padded path is exercised)
};

size_t dp_collectives(const comm::CommPtr& world) {
  size_t n = 0;
  for (const auto& e : world->recorder()->entries()) n += e.group == "dp_cp";
  return n;
}

void check_grads(const Case& k, ModelChunk& par, ModelChunk& ref, const std::optional<DistributedOptimizer>& dopt,
                 const std::string& what) {
  if (!k.distributed_optimizer) {
    for (const auto& p : par.params().params()) {
      const Tensor r = shard_of(*p, ref.params().find(p->spec.key)->main_grad);
      // fp32, different reduction orders (DP average of partial means): 1e-5 relative.
      EXPECT_LT(rel_err(p->main_grad, r, r), 1e-5) << what << " grad " << p->spec.key;
    }
    return;
  }
  for (const ShardPiece& pc : dopt->pieces()) {
    const Tensor r = shard_of(*pc.owner, ref.params().find(pc.owner->spec.key)->main_grad);
    EXPECT_LT(rel_err(pc.main_grad, r.flat_slice(pc.param_offset, {pc.numel}), r), 1e-5)
        << what << " grad piece " << pc.owner->spec.key << " @" << pc.param_offset;
  }
}

void check_dp_equivalence(const Case& k) {
  comm::CommPtr world = comm::world();
  ParallelContext pc =
      ParallelContext::create(world, {.tensor_model_parallel_size = k.tp, .context_parallel_size = k.cp});
  ParallelContext single = ParallelContext::single(comm::make_local_world());
  const int dp = pc.dp_size(), r = pc.dp_rank(), M = k.microbatches;
  const int64_t b = 2;
  const TransformerConfig c = config_for(k.style);
  ModelChunk ref(c, 42, {single.tp(), false});
  ModelChunk par(c, 42, {pc.tp(), k.sequence_parallel, false, pc.cp()});
  // eps 1e-4: see parallel_equivalence_driver.cpp (exact-zero grads are rounding noise of either sign).
  const AdamOptions adam{.eps = 1e-4f, .weight_decay = 0.1f};
  Adam ref_opt(adam_params(ref.params()), adam);
  DistributedDataParallel ddp(par.params(), pc,
                              {.bucket_size = k.bucket_size, .overlap_grad_reduce = k.overlap_grad_reduce,
                               .use_distributed_optimizer = k.distributed_optimizer});
  std::optional<Adam> par_adam;
  std::optional<DistributedOptimizer> dopt;
  if (k.distributed_optimizer) dopt.emplace(ddp, DistributedOptimizerOptions{adam, k.overlap_param_gather});
  else par_adam.emplace(adam_params(par.params()), adam);
  const std::string what = k.style + " tp=" + std::to_string(k.tp) + " cp=" + std::to_string(k.cp) +
                           " dp=" + std::to_string(dp) +
                           " buckets=" + std::to_string(ddp.buckets().size()) +
                           (k.overlap_grad_reduce ? " overlap" : "") + (k.distributed_optimizer ? " distopt" : "") +
                           (k.overlap_param_gather ? " overlap-param-gather" : "") + " M=" + std::to_string(M);
  if (dopt) {
    // Shards partition the buffer: the owned elements of all DP ranks sum to the model's numel.
    Tensor owned = Tensor::empty({1}, DType::I32);
    owned.data<int32_t>()[0] = static_cast<int32_t>(dopt->shard_numel());
    ddp.dp_group()->all_reduce(owned, comm::ReduceOp::Sum).wait();
    EXPECT_EQ(owned.data<int32_t>()[0], par.params().numel()) << what;
    // Measured optimizer-state bytes per parameter = the formula 8/dp up to bucket padding (< dp
    // elements per bucket, each 8 bytes spread over numel parameters); the shards span dp x cp ranks.
    const MemoryReport want = memory_report(dp, true, DType::F32, k.cp), got = dopt->measured_memory();
    EXPECT_EQ(got.dp, dp) << what;
    EXPECT_EQ(got.cp, k.cp) << what;
    const double slack = 8.0 * static_cast<double>(ddp.buckets().size()) / static_cast<double>(par.params().numel());
    EXPECT_NEAR(got.optimizer_state_bytes, want.optimizer_state_bytes, slack) << what;
    EXPECT_DOUBLE_EQ(got.param_bytes + got.grad_bytes, want.param_bytes + want.grad_bytes) << what;
  }
  if (k.expect_padding) {
    bool padded = false;
    for (const Bucket& bk : ddp.buckets()) padded |= bk.padded_numel != bk.numel();
    ASSERT_TRUE(padded) << what << ": no bucket needs padding, the padded path is not exercised";
  }

  for (int step = 0; step < 3; ++step) {
    const int64_t B = dp * M * b;
    Batch full = batch_cols(step, c.seq_length, 0, B);
    ref.params().zero_grad();
    GPTModelCtx rc;
    const LossResult rl = ref.forward_loss(rc, full.tokens, full.labels, full.mask, {.training = false});
    ref.backward(rc, 1.0f);
    finalize_model_grads(ref.params(), single, !c.untie_embeddings_and_output_weights);

    if (dopt) dopt->wait_param_gather();  // the trainer's first call of an iteration
    ddp.zero_grad();
    double loss = 0;
    for (int m = 0; m < M; ++m) {
      const size_t before = dp_collectives(world);
      ddp.set_is_last_microbatch(m == M - 1);
      Batch mb = batch_cols(step, c.seq_length, (int64_t{r} * M + m) * b, b);
      if (k.cp > 1) {  // this CP rank's rows [cp_rank * s/cp, +s/cp)
        const int64_t rows = c.seq_length / k.cp, first = pc.cp_rank() * rows;
        mb = {mb.tokens.narrow0(first, rows).clone(), mb.labels.narrow0(first, rows).clone(),
              mb.mask.narrow0(first, rows).clone()};
      }
      GPTModelCtx ctx;
      loss += par.forward_loss(ctx, mb.tokens, mb.labels, mb.mask, {.training = false}).loss / M;
      par.backward(ctx, 1.0f / static_cast<float>(M));
      if (m < M - 1) {
        EXPECT_EQ(dp_collectives(world), before) << what << ": DP collective before the last microbatch";
      } else if (k.overlap_grad_reduce && ddp.buckets().size() > 1) {
        EXPECT_GT(dp_collectives(world), before) << what << ": overlap posted nothing during the last backward";
      }
    }
    ddp.finish_grad_sync();
    finalize_model_grads(par.params(), pc, !c.untie_embeddings_and_output_weights);
    Tensor lt = Tensor::empty({1});
    lt.data<float>()[0] = static_cast<float>(loss);
    ddp.dp_group()->all_reduce(lt, comm::ReduceOp::Avg).wait();
    EXPECT_NEAR(lt.data<float>()[0], rl.loss, 1e-5 * std::abs(rl.loss)) << what << " loss step " << step;
    check_grads(k, par, ref, dopt, what + " step " + std::to_string(step));

    const double rn = model_grad_norm(ref.params(), single);
    const double pn = dopt ? dopt->grad_norm() : model_grad_norm(par.params(), pc);
    EXPECT_NEAR(pn, rn, 1e-5 * rn) << what << " grad norm step " << step;
    clip_grads_by_total_norm(ref.params(), rn, 0.5);  // small max_norm: clipping is exercised
    if (dopt) dopt->clip_grads(pn, 0.5);
    else clip_grads_by_total_norm(par.params(), pn, 0.5);
    ref_opt.step(1e-2f);
    if (dopt) dopt->step(1e-2f);
    else par_adam->step(1e-2f);
  }
  if (dopt) dopt->wait_param_gather();
  for (const auto& p : par.params().params()) {
    const Tensor rp = shard_of(*p, ref.params().find(p->spec.key)->data);
    // Adam divides each gradient by its own running RMS, so a grad difference at the 1e-5 level checked above
    // reaches the parameters undamped; a bias that started at 0 holds only ~3 lr of updates, so its normwise
    // error is that of its grads (1.0-1.2e-5 on OpenBLAS's Haswell / Zen kernels, < 1e-5 on SkylakeX): 3e-5.
    EXPECT_LT(rel_err(p->data, rp, rp), 3e-5) << what << " param after 3 steps " << p->spec.key;
  }
}

// DP = world: plain DDP with one bucket / many buckets, with and without overlap.
TEST(DataParallel, Gpt2OneBucketNoOverlap) { check_dp_equivalence({.bucket_size = 0}); }
TEST(DataParallel, Gpt2TinyBucketsOverlap) { check_dp_equivalence({.bucket_size = 1, .overlap_grad_reduce = true}); }
TEST(DataParallel, Gpt2MidBucketsOverlap) { check_dp_equivalence({.bucket_size = 3000, .overlap_grad_reduce = true}); }
TEST(DataParallel, LlamaTinyBucketsOverlap) {
  check_dp_equivalence({.style = "llama", .bucket_size = 1, .overlap_grad_reduce = true});
}
TEST(DataParallel, LlamaHugeBucketNoOverlap) { check_dp_equivalence({.style = "llama", .bucket_size = 1'000'000'000}); }
TEST(DataParallel, GradAccumulationReducesOnlyAfterLastMicrobatch) {
  check_dp_equivalence({.bucket_size = 1, .overlap_grad_reduce = true, .microbatches = 2});
}

// Distributed optimizer vs plain Adam on one rank.
TEST(DistributedOptimizer, Gpt2OneBucket) { check_dp_equivalence({.distributed_optimizer = true}); }
TEST(DistributedOptimizer, Gpt2TinyBucketsOverlapBoth) {
  check_dp_equivalence({.bucket_size = 1, .overlap_grad_reduce = true, .distributed_optimizer = true,
                        .overlap_param_gather = true});
}
TEST(DistributedOptimizer, PaddedBuckets) {
  check_dp_equivalence({.style = "gpt2odd", .bucket_size = 500, .overlap_grad_reduce = true,
                        .distributed_optimizer = true, .expect_padding = comm::world()->size() > 1});
}
TEST(DistributedOptimizer, LlamaMidBucketsAccumulation) {
  check_dp_equivalence({.style = "llama", .bucket_size = 3000, .overlap_grad_reduce = true,
                        .distributed_optimizer = true, .overlap_param_gather = true, .microbatches = 2});
}

// TP2 x DP2 on 4 ranks vs 1 rank, both styles.
// Context parallelism (all-to-all attention) at CP = world (and CP2 x DP2, CP2 x TP2 + SP at 4 ranks): the
// same losses, gradients, grad norm and parameters as the single-rank model on the whole sequences.
TEST(ContextParallel, Gpt2CpWorld) {
  if (comm::world()->size() > 4) GTEST_SKIP() << "seq_length 8 allows cp <= 4";
  check_dp_equivalence({.cp = comm::world()->size(), .bucket_size = 3000, .overlap_grad_reduce = true});
}
TEST(ContextParallel, LlamaCpWorldRopeGqa) {
  if (comm::world()->size() > 4) GTEST_SKIP() << "4 query groups allow cp <= 4";
  check_dp_equivalence({.style = "llama", .cp = comm::world()->size(), .microbatches = 2});
}
TEST(ContextParallel, Gpt2Cp2Dp2DistributedOptimizer) {
  if (comm::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_dp_equivalence({.cp = 2, .bucket_size = 1, .overlap_grad_reduce = true, .distributed_optimizer = true,
                        .overlap_param_gather = true, .microbatches = 2});
}
TEST(ContextParallel, LlamaTp2SpCp2) {
  if (comm::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_dp_equivalence({.style = "llama", .tp = 2, .cp = 2, .sequence_parallel = true});
}
TEST(ContextParallel, Gpt2Tp2Cp2) {
  if (comm::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_dp_equivalence({.tp = 2, .cp = 2});
}

TEST(TensorDataParallel, Gpt2SequenceParallelTp2Dp2) {
  if (comm::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_dp_equivalence({.tp = 2, .sequence_parallel = true, .bucket_size = 2000, .overlap_grad_reduce = true});
}
TEST(TensorDataParallel, LlamaTp2Dp2) {
  if (comm::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_dp_equivalence({.style = "llama", .tp = 2, .bucket_size = 1, .overlap_grad_reduce = true});
}
TEST(TensorDataParallel, Gpt2Tp2Dp2DistributedOptimizer) {
  if (comm::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_dp_equivalence({.tp = 2, .sequence_parallel = true, .bucket_size = 1, .overlap_grad_reduce = true,
                        .distributed_optimizer = true, .overlap_param_gather = true, .microbatches = 2});
}
TEST(TensorDataParallel, LlamaTp2Dp2DistributedOptimizer) {
  if (comm::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_dp_equivalence({.style = "llama", .tp = 2, .bucket_size = 5000, .distributed_optimizer = true});
}

// Mixed precision (bf16 model params, fp32 masters) with the distributed optimizer at DP = world:
void fill_dyadic_grads(ParamAndGradBuffer& buf, int step) {
  // Multiples of 1/128 in [-30/128, 30/128]: the DP average (sum of dp equal values, / dp) is exact.
  for (const auto& p : buf.params()) {
    float* g = p->main_grad.data<float>();
    const uint64_t h = std::hash<std::string>{}(p->spec.key);
    for (int64_t i = 0; i < p->main_grad.numel(); ++i)
      g[i] = static_cast<float>(static_cast<int64_t>((h + static_cast<uint64_t>(i) * 7 + step * 3) % 61) - 30) / 128.0f;
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

std::vector<AdamParam> mixed_adam_params(ModelChunk& m) {
  std::vector<AdamParam> out;
  for (const auto& p : m.params().params())
    out.push_back({.name = p->spec.key, .param = p->main_param, .main_grad = p->main_grad,
                   .no_weight_decay = p->spec.no_weight_decay, .model_param = p->data});
  return out;
}

const AdamState& state_of(const Adam& a, const std::string& key) {
  for (const AdamState& s : a.state())
    if (s.name == key) return s;
  fail("no Adam state for {}", key);
}

// The fp32 masters live only in this rank's shard (the buffer's whole copy is freed: 4 / dp bytes a
// parameter), and after 3 steps the bf16 model copy, every master piece and the moments equal a single-rank
// replicated Adam's bit for bit. A checkpoint written from the shards loads bit for bit into a single-rank
// replicated Adam and into a fresh distributed optimizer, and (--finetune) the masters load without moments.
TEST(DistributedOptimizer, MixedPrecisionShardsTheMainParams) {
  comm::CommPtr world = comm::world();
  ParallelContext pc = ParallelContext::create(world, {});
  ParallelContext single = ParallelContext::single(comm::make_local_world());
  const int dp = pc.dp_size();
  const TransformerConfig c = config_for("gpt2odd");  // buckets need padding
  const AdamOptions adam{.eps = 1e-4f, .weight_decay = 0.1f};
  const DdpOptions ddp_opt{.bucket_size = 700, .use_distributed_optimizer = true};
  ModelChunk ref(c, 42, {single.tp(), false}, Device::CPU, {}, DType::BF16);
  Adam ref_opt(mixed_adam_params(ref), adam);
  ModelChunk par(c, 42, {pc.tp(), false}, Device::CPU, {}, DType::BF16);
  DistributedDataParallel ddp(par.params(), pc, ddp_opt);
  DistributedOptimizer opt(ddp, {.adam = adam});
  ASSERT_GT(ddp.buckets().size(), 2u);
  ASSERT_TRUE(opt.main_params_sharded());
  EXPECT_FALSE(par.params().has_main_params());
  EXPECT_THROW(par.params().main_param_buffer(), Error);
  for (const auto& p : par.params().params()) EXPECT_FALSE(p->main_param.defined()) << p->spec.key;
  // Megatron's table: main params 4 / dp and moments 8 / dp, up to the padding (< dp elements per bucket).
  const MemoryReport want = memory_report(dp, true, DType::BF16), got = opt.measured_memory();
  const double n = static_cast<double>(par.params().numel()), pad = 12.0 * static_cast<double>(ddp.buckets().size()) * dp / n;
  EXPECT_NEAR(got.main_param_bytes, want.main_param_bytes, pad);
  EXPECT_NEAR(got.optimizer_state_bytes, want.optimizer_state_bytes, pad);
  EXPECT_DOUBLE_EQ(got.param_bytes, 2.0);
  EXPECT_EQ(opt.state_bytes(), static_cast<int64_t>((got.main_param_bytes + got.optimizer_state_bytes) * n + 0.5));
  // The shards start as the initial masters.
  for (const ShardPiece& pc_ : opt.pieces())
    ASSERT_TRUE(same_bytes(pc_.param, ref.params().find(pc_.owner->spec.key)->main_param.flat_slice(pc_.param_offset, {pc_.numel})))
        << pc_.owner->spec.key;

  auto check_equal_to_ref = [&](ModelChunk& m, const DistributedOptimizer& o, bool moments, const std::string& what) {
    EXPECT_TRUE(same_bytes(m.params().param_buffer(), ref.params().param_buffer())) << what << ": bf16 model copy";
    for (const ShardPiece& pc_ : o.pieces()) {
      const std::string& key = pc_.owner->spec.key;
      const Parameter* r = ref.params().find(key);
      EXPECT_TRUE(same_bytes(pc_.param, r->main_param.flat_slice(pc_.param_offset, {pc_.numel}))) << what << " master " << key;
      const AdamState& rs = state_of(ref_opt, key);
      const Tensor m0 = moments ? rs.exp_avg.flat_slice(pc_.param_offset, {pc_.numel}) : Tensor::zeros({pc_.numel});
      const Tensor v0 = moments ? rs.exp_avg_sq.flat_slice(pc_.param_offset, {pc_.numel}) : Tensor::zeros({pc_.numel});
      EXPECT_TRUE(same_bytes(pc_.exp_avg, m0)) << what << " exp_avg " << key;
      EXPECT_TRUE(same_bytes(pc_.exp_avg_sq, v0)) << what << " exp_avg_sq " << key;
    }
  };
  for (int step = 0; step < 3; ++step) {
    fill_dyadic_grads(ref.params(), step);
    ddp.zero_grad();
    fill_dyadic_grads(par.params(), step);
    ddp.finish_grad_sync();
    ref_opt.step(1e-2f);
    opt.step(1e-2f);
  }
  check_equal_to_ref(par, opt, true, "after 3 steps dp=" + std::to_string(dp));

  // Checkpoint: every DP rank writes its master pieces; the directory is rank 0's.
  Tensor id = Tensor::zeros({1}, DType::I32);
  if (world->rank() == 0) id.data<int32_t>()[0] = static_cast<int32_t>(::getpid());
  world->broadcast(id, 0).wait();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("mcpp_distopt_bf16_" + std::to_string(id.data<int32_t>()[0]))).string();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  world->barrier().wait();
  Config cfg;
  cfg.model = c;
  cfg.training.bf16 = true;
  cfg.parallel.use_distributed_optimizer = true;
  TrainerState state;
  state.iteration = 3;
  save_training_checkpoint(dir, cfg, {&par}, OptimizerRef{.distributed = &opt}, state, pc);
  world->barrier().wait();
  {  // one rank, replicated Adam
    ModelChunk one(c, 7, {single.tp(), false}, Device::CPU, {}, DType::BF16);
    Adam one_opt(mixed_adam_params(one), adam);
    TrainerState st;
    ASSERT_TRUE(load_training_checkpoint(dir, cfg, {&one}, OptimizerRef{.adam = &one_opt}, st, {}, nullptr));
    EXPECT_EQ(one_opt.step_count(), 3);
    EXPECT_TRUE(same_bytes(one.params().main_param_buffer(), ref.params().main_param_buffer())) << "masters at 1 rank";
    EXPECT_TRUE(same_bytes(one.params().param_buffer(), ref.params().param_buffer())) << "bf16 copy at 1 rank";
    for (const AdamState& s : one_opt.state()) {
      EXPECT_TRUE(same_bytes(s.exp_avg, state_of(ref_opt, s.name).exp_avg)) << s.name;
      EXPECT_TRUE(same_bytes(s.exp_avg_sq, state_of(ref_opt, s.name).exp_avg_sq)) << s.name;
    }
  }
  for (const bool finetune : {false, true}) {  // a fresh distributed optimizer at this DP
    ModelChunk again(c, 7, {pc.tp(), false}, Device::CPU, {}, DType::BF16);
    DistributedDataParallel ddp2(again.params(), pc, ddp_opt);
    DistributedOptimizer opt2(ddp2, {.adam = adam});
    // The masters live in opt2's shard: reading the model without it would drop them, so it is an error.
    EXPECT_THROW(read_model_chunks(dist_checkpointing::CheckpointReader(dir), {&again}), Error);
    TrainerState st;
    ASSERT_TRUE(load_training_checkpoint(dir, cfg, {&again}, OptimizerRef{.distributed = &opt2}, st,
                                         {.finetune = finetune}, nullptr));
    EXPECT_EQ(opt2.step_count(), finetune ? 0 : 3);
    check_equal_to_ref(again, opt2, !finetune, finetune ? "finetune load" : "load");
  }
  world->barrier().wait();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mcpp

int main(int argc, char** argv) { return mcpp::testing::run_mpi_gtest(argc, argv); }
