// DistributedDataParallel / DistributedOptimizer unit tests on one process (LocalCommunicator): bucket
// layout (backward order, boundaries at parameters, padding to dp, shard ranges covering every element
// once), grad-ready overlap and gradient accumulation seen through the flight recorder, error cases, the
// distributed optimizer at dp = 1 against plain Adam, and the memory report numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/distributed/data_parallel.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/training/checkpointing.h"
#include "training/trainer_test_util.h"
#include "models/gpt_test_util.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"

namespace mcpp {
namespace {

using parallel_state::ParallelContext;

// Params registered in order a(10), b(7), c(3), d(5), e(1): backward order e, d, c, b, a.
std::unique_ptr<ParamAndGradBuffer> small_buffer() {
  auto buf = std::make_unique<ParamAndGradBuffer>();
  const std::vector<std::pair<std::string, int64_t>> ps = {{"a", 10}, {"b", 7}, {"c", 3}, {"d", 5}, {"e", 1}};
  for (const auto& [k, n] : ps) buf->add({.key = k, .shape = {n}, .no_weight_decay = (k == "c")});
  buf->finalize(7);
  return buf;
}

std::vector<std::string> keys(const Bucket& b) {
  std::vector<std::string> out;
  for (const Parameter* p : b.params) out.push_back(p->spec.key);
  return out;
}

TEST(DdpBuckets, BackwardOrderAndBoundariesAtParameters) {
  auto buf = small_buffer();
  // bucket_size 6: e(1)+d(5)=6 closes; c(3)+b(7)=10 closes; a(10) closes.
  std::vector<Bucket> bs = make_buckets(*buf, 6, 1, false);
  ASSERT_EQ(bs.size(), 3u);
  EXPECT_EQ(keys(bs[0]), (std::vector<std::string>{"e", "d"}));
  EXPECT_EQ(keys(bs[1]), (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(keys(bs[2]), (std::vector<std::string>{"a"}));
  int64_t expect_start = 0;
  for (const Bucket& b : bs) {
    EXPECT_EQ(b.start, expect_start);
    EXPECT_EQ(b.start, b.params.front()->offset);  // starts at a parameter
    EXPECT_EQ(b.end, b.params.back()->offset + b.params.back()->data.numel());  // ends at one
    EXPECT_EQ(b.padded_numel, b.numel());
    expect_start = b.end;
  }
  EXPECT_EQ(expect_start, buf->numel());
  // Tiny: one bucket per parameter. Huge: one bucket. 0: Megatron's default (one bucket here).
  EXPECT_EQ(make_buckets(*buf, 1, 1, false).size(), 5u);
  EXPECT_EQ(make_buckets(*buf, 1'000'000, 1, false).size(), 1u);
  EXPECT_EQ(make_buckets(*buf, 0, 1, false).size(), 1u);
  EXPECT_EQ(default_bucket_size(1), 40'000'000);
  EXPECT_EQ(default_bucket_size(64), 64'000'000);
}

TEST(DdpBuckets, PaddingAndShardRangesCoverEveryElementOnce) {
  auto buf = small_buffer();
  for (int dp : {1, 2, 3, 4, 8, 32}) {
    for (int64_t size : {1, 6, 11, 1000}) {
      std::vector<Bucket> bs = make_buckets(*buf, size, dp, true);
      std::vector<int> owners(static_cast<size_t>(buf->numel()), 0);
      for (const Bucket& b : bs) {
        EXPECT_EQ(b.padded_numel % dp, 0) << "dp " << dp;
        EXPECT_GE(b.padded_numel, b.numel());
        EXPECT_LT(b.padded_numel - b.numel(), dp);  // minimal padding
        for (int r = 0; r < dp; ++r) {
          BufferRange own = b.owned_range(r, dp);
          EXPECT_GE(own.begin, b.start);
          EXPECT_LE(own.end, b.end);
          EXPECT_LE(own.numel(), b.shard_size(dp));
          EXPECT_EQ(own.begin, std::min(b.start + r * b.shard_size(dp), b.end));
          for (int64_t i = own.begin; i < own.end; ++i) ++owners[static_cast<size_t>(i)];
        }
      }
      for (int64_t i = 0; i < buf->numel(); ++i)
        EXPECT_EQ(owners[static_cast<size_t>(i)], 1) << "element " << i << " dp " << dp << " size " << size;
    }
  }
  // A worked case: bucket of 6 elements (e, d) at dp 4 pads to 8, shards of 2: rank 3 owns [6, 6).
  std::vector<Bucket> bs = make_buckets(*buf, 6, 4, true);
  EXPECT_EQ(bs[0].padded_numel, 8);
  EXPECT_EQ(bs[0].owned_range(2, 4).begin, 4);
  EXPECT_EQ(bs[0].owned_range(2, 4).end, 6);
  EXPECT_EQ(bs[0].owned_range(3, 4).numel(), 0);
}

TEST(DdpBuckets, RejectsUnfinalizedBuffer) {
  ParamAndGradBuffer buf;
  buf.add({.key = "w", .shape = {3}});
  EXPECT_THROW(make_buckets(buf, 1, 1, false), Error);
}

struct Fixture {
  comm::CommPtr world = comm::make_local_world();
  ParallelContext pc = ParallelContext::single(world);
  std::unique_ptr<ParamAndGradBuffer> buf = small_buffer();
  size_t dp_calls() const {
    size_t n = 0;
    for (const auto& e : world->recorder()->entries()) n += e.group == "dp_cp";
    return n;
  }
};

TEST(Ddp, OverlapPostsEachBucketWhenItsParamsAreReadyOnlyInLastMicrobatch) {
  Fixture f;
  DistributedDataParallel ddp(*f.buf, f.pc, {.bucket_size = 6, .overlap_grad_reduce = true});
  auto report = [&](const std::string& k) { f.buf->find(k)->grad_ready(); };
  // Microbatch 1 of 2: nothing is posted.
  ddp.set_is_last_microbatch(false);
  for (const char* k : {"e", "d", "c", "b", "a"}) report(k);
  EXPECT_EQ(f.dp_calls(), 0u);
  // Last microbatch: bucket 0 (e, d) posts after d; bucket 1 waits for b; bucket 2 after a.
  ddp.set_is_last_microbatch(true);
  report("e");
  EXPECT_EQ(f.dp_calls(), 0u);
  report("d");
  EXPECT_EQ(f.dp_calls(), 1u);
  report("c");
  EXPECT_EQ(f.dp_calls(), 1u);
  report("b");
  EXPECT_EQ(f.dp_calls(), 2u);
  report("a");
  EXPECT_EQ(f.dp_calls(), 3u);
  ddp.finish_grad_sync();
  EXPECT_EQ(f.dp_calls(), 3u);
  for (const auto& e : f.world->recorder()->entries()) {
    if (e.group != "dp_cp") continue;
    EXPECT_EQ(e.op, "all_reduce");
    EXPECT_EQ(e.reduce_op, "avg");
  }
}

TEST(Ddp, OverlapPostsInBucketOrderEvenWhenALaterBucketIsReadyFirst) {
  Fixture f;
  DistributedDataParallel ddp(*f.buf, f.pc, {.bucket_size = 6, .overlap_grad_reduce = true});
  f.buf->find("a")->grad_ready();  // bucket 2 complete, but 0 and 1 are not
  EXPECT_EQ(f.dp_calls(), 0u);
  for (const char* k : {"c", "b"}) f.buf->find(k)->grad_ready();
  EXPECT_EQ(f.dp_calls(), 0u);
  for (const char* k : {"e", "d"}) f.buf->find(k)->grad_ready();
  EXPECT_EQ(f.dp_calls(), 3u);
  const auto entries = f.world->recorder()->entries();
  std::vector<int64_t> counts;
  for (const auto& e : entries)
    if (e.group == "dp_cp") counts.push_back(e.count);
  EXPECT_EQ(counts, (std::vector<int64_t>{6, 10, 10}));  // bucket 0, 1, 2 sizes, in order
  ddp.finish_grad_sync();
}

TEST(Ddp, ErrorsNameTheParameter) {
  Fixture f;
  DistributedDataParallel ddp(*f.buf, f.pc, {.bucket_size = 6, .overlap_grad_reduce = true});
  f.buf->find("e")->grad_ready();
  try {
    f.buf->find("e")->grad_ready();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'e'"), std::string::npos) << e.what();
  }
  try {
    ddp.finish_grad_sync();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'d'"), std::string::npos) << e.what();
  }
  // A second wrapper on the same buffer would steal the hook.
  EXPECT_THROW(DistributedDataParallel(*f.buf, f.pc, {.overlap_grad_reduce = true}), Error);
  EXPECT_THROW(DistributedDataParallel(*f.buf, f.pc, {.bucket_size = -1}), Error);
}

TEST(Ddp, WithoutOverlapHookIsNotInstalledAndFinishReduces) {
  Fixture f;
  DistributedDataParallel ddp(*f.buf, f.pc, {.bucket_size = 11});
  EXPECT_FALSE(f.buf->grad_ready_hook());
  f.buf->grad_buffer().fill_(2.0f);
  ddp.finish_grad_sync();
  EXPECT_EQ(f.dp_calls(), ddp.buckets().size());
  EXPECT_EQ(f.buf->grad_buffer().data<float>()[0], 2.0f);  // Avg over one rank
}

// set_overwrite_main_grad: zero_grad clears nothing and marks every main grad stale; a whole-gradient writer
// takes the overwrite only when all its parameters are stale (else the stale ones are zeroed and it
// accumulates); materialize_grads / zero_stale_grads zero exactly the stale ones (the DDP grad sync runs
// the latter before reducing); grad_ready on a never-written parameter is a named error.
TEST(ParamAndGradBuffer, OverwriteMainGradMarksStaleAndZeroesOnlyWhatNoWriterOverwrote) {
  Fixture f;
  ParamAndGradBuffer& buf = *f.buf;
  auto p = [&](const char* k) { return buf.find(k); };
  auto all_equal = [](const Parameter* q, float v) {
    for (int64_t i = 0; i < q->main_grad.numel(); ++i)
      if (q->main_grad.data<float>()[i] != v) return false;
    return true;
  };
  buf.grad_buffer().fill_(7.0f);
  buf.zero_grad();  // default: zeroes the buffer
  EXPECT_TRUE(all_equal(p("a"), 0.0f));
  EXPECT_FALSE(p("a")->grad_stale);
  buf.set_overwrite_main_grad(true);
  buf.grad_buffer().fill_(7.0f);
  buf.zero_grad();
  for (const auto& q : buf.params()) {
    EXPECT_TRUE(q->grad_stale) << q->spec.key;
    EXPECT_TRUE(all_equal(q.get(), 7.0f)) << q->spec.key;  // nothing was written
  }
  EXPECT_TRUE(take_grad_overwrite({p("a"), p("b")}));  // both stale: the caller overwrites, nothing zeroed
  EXPECT_FALSE(p("a")->grad_stale || p("b")->grad_stale);
  EXPECT_TRUE(all_equal(p("a"), 7.0f) && all_equal(p("b"), 7.0f));
  EXPECT_FALSE(take_grad_overwrite({p("c"), p("a")}));  // a was written already: c zeroed, both accumulate
  EXPECT_FALSE(p("c")->grad_stale);
  EXPECT_TRUE(all_equal(p("c"), 0.0f) && all_equal(p("a"), 7.0f));
  EXPECT_FALSE(take_grad_overwrite({nullptr}));
  materialize_grads({p("d"), nullptr});
  EXPECT_TRUE(all_equal(p("d"), 0.0f));
  EXPECT_TRUE(p("e")->grad_stale);
  try {
    p("e")->grad_ready();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'e'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("never written"), std::string::npos) << e.what();
  }
  DistributedDataParallel ddp(buf, f.pc, {.bucket_size = 11});
  ddp.finish_grad_sync();  // zero_stale_grads first: e was never written this step
  EXPECT_FALSE(p("e")->grad_stale);
  EXPECT_TRUE(all_equal(p("e"), 0.0f));
  EXPECT_TRUE(all_equal(p("a"), 7.0f) && all_equal(p("b"), 7.0f));  // Avg over one rank
}

TEST(Ddp, ParamGatherNeedsDistributedOptimizerAndBlocksGradReduction) {
  Fixture f;
  {
    DistributedDataParallel plain(*f.buf, f.pc, {});
    EXPECT_THROW(plain.start_param_gather(), Error);
  }
  DistributedDataParallel ddp(*f.buf, f.pc, {.bucket_size = 6, .use_distributed_optimizer = true});
  ddp.start_param_gather();
  EXPECT_TRUE(ddp.param_gather_in_flight());
  EXPECT_THROW(ddp.start_param_gather(), Error);  // two gathers in flight
  EXPECT_THROW(ddp.finish_grad_sync(), Error);    // the trainer forgot wait_param_gather()
  ddp.wait_param_gather();
  EXPECT_FALSE(ddp.param_gather_in_flight());
  ddp.finish_grad_sync();
  size_t rs = 0, ag = 0;
  for (const auto& e : f.world->recorder()->entries()) {
    rs += e.op == "reduce_scatter";
    ag += e.op == "all_gather";
  }
  EXPECT_EQ(rs, ddp.buckets().size());
  EXPECT_EQ(ag, ddp.buckets().size());
}

TEST(Ddp, DestructorRemovesTheHook) {
  Fixture f;
  {
    DistributedDataParallel ddp(*f.buf, f.pc, {.overlap_grad_reduce = true});
    EXPECT_TRUE(f.buf->grad_ready_hook());
  }
  EXPECT_FALSE(f.buf->grad_ready_hook());
}

// Distributed optimizer at dp = 1 (reduce-scatter / all-gather of one rank) against plain Adam on a GPT
// model: three steps with two microbatches each, identical bits.
TEST(DistributedOptimizer, MatchesAdamAtDp1) {
  for (const std::string style : {"gpt2", "llama"}) {
    const TransformerConfig c = testing::tiny_config(style);
    comm::CommPtr world = comm::make_local_world();
    ParallelContext pc = ParallelContext::single(world);
    ModelChunk ref(c, 3, {pc.tp(), false});
    ModelChunk par(c, 3, {pc.tp(), false});
    const AdamOptions adam{.eps = 1e-4f, .weight_decay = 0.1f};
    std::vector<AdamParam> aps;
    for (const auto& p : ref.params().params())
      aps.push_back({.name = p->spec.key, .param = p->data, .main_grad = p->main_grad,
                     .no_weight_decay = p->spec.no_weight_decay});
    Adam ref_opt(aps, adam);
    DistributedDataParallel ddp(par.params(), pc,
                                {.bucket_size = 1000, .overlap_grad_reduce = true, .use_distributed_optimizer = true});
    DistributedOptimizer opt(ddp, {.adam = adam, .overlap_param_gather = true});
    ASSERT_GT(ddp.buckets().size(), 2u);
    EXPECT_EQ(opt.shard_numel(), par.params().numel());
    for (int step = 0; step < 3; ++step) {
      ref.params().zero_grad();
      opt.wait_param_gather();
      ddp.zero_grad();
      for (int m = 0; m < 2; ++m) {
        testing::Batch bt = testing::fixed_batch(12, 2, c.vocab_size, step * 2 + m);
        GPTModelCtx rc, pcx;
        ref.forward_loss(rc, bt.tokens, bt.labels, bt.loss_mask, {.training = false});
        ref.backward(rc, 0.5f);
        ddp.set_is_last_microbatch(m == 1);
        par.forward_loss(pcx, bt.tokens, bt.labels, bt.loss_mask, {.training = false});
        par.backward(pcx, 0.5f);
      }
      ddp.finish_grad_sync();
      ASSERT_EQ(0, std::memcmp(ref.params().grad_buffer().raw(), par.params().grad_buffer().raw(),
                               par.params().grad_buffer().nbytes())) << style;
      ref_opt.step(1e-2f);
      opt.step(1e-2f);
    }
    opt.wait_param_gather();
    EXPECT_EQ(0, std::memcmp(ref.params().param_buffer().raw(), par.params().param_buffer().raw(),
                             par.params().param_buffer().nbytes())) << style;
    EXPECT_EQ(opt.step_count(), 3);
    // State pieces: every parameter's whole tensor, moments equal to Adam's.
    for (const DistOptStatePiece& s : opt.state()) {
      EXPECT_EQ(s.offset, 0);
      EXPECT_EQ(s.numel, s.param_numel);
      for (const AdamState& a : ref_opt.state())
        if (a.name == s.key) {
          EXPECT_EQ(0, std::memcmp(a.exp_avg.raw(), s.exp_avg.raw(), s.exp_avg.nbytes())) << s.key;
          EXPECT_EQ(0, std::memcmp(a.exp_avg_sq.raw(), s.exp_avg_sq.raw(), s.exp_avg_sq.nbytes())) << s.key;
        }
    }
  }
}

TEST(DistributedOptimizer, NeedsDistributedDdpAndLoadsState) {
  Fixture f;
  {
    DistributedDataParallel plain(*f.buf, f.pc, {});
    EXPECT_THROW(DistributedOptimizer(plain, {}), Error);
  }
  DistributedDataParallel ddp(*f.buf, f.pc, {.bucket_size = 6, .use_distributed_optimizer = true});
  DistributedOptimizer opt(ddp, {});
  opt.load_state(5, [](const std::string&, int64_t offset, Tensor& m, Tensor& v) {
    m.fill_(static_cast<float>(offset) + 1.0f);
    v.fill_(2.0f);
    return true;
  });
  EXPECT_EQ(opt.step_count(), 5);
  for (const DistOptStatePiece& s : opt.state()) EXPECT_EQ(s.exp_avg.data<float>()[0], 1.0f) << s.key;
  try {
    opt.load_state(1, [](const std::string& k, int64_t, Tensor&, Tensor&) { return k != "b"; });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'b'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DistributedOptimizer(ddp, {.adam = {.eps = 0.0f}}), Error);
}

// Mixed precision: the optimizer copies its shard of the fp32 masters and the buffer frees its whole copy
// (at dp 1 the shard is everything); what then needs the whole masters fails with a message that says why.
// Multi-rank equivalence and checkpoints: tests/mpi/ddp_equivalence_driver.cpp.
TEST(DistributedOptimizer, MixedPrecisionMastersMoveIntoTheShards) {
  comm::CommPtr world = comm::make_local_world();
  ParallelContext pc = ParallelContext::single(world);
  ModelChunk m(testing::tiny_config("gpt2"), 3, {pc.tp(), false}, Device::CPU, {}, DType::BF16);
  const Tensor masters = m.params().main_param_buffer().clone();
  DistributedDataParallel ddp(m.params(), pc, {.bucket_size = 1000, .use_distributed_optimizer = true});
  DistributedOptimizer opt(ddp, {});
  EXPECT_TRUE(opt.main_params_sharded());
  EXPECT_FALSE(m.params().has_main_params());
  using training_test::error_of;
  EXPECT_NE(error_of([&] { m.params().main_param_buffer(); }).find("sharded by the distributed optimizer"),
            std::string::npos);
  int64_t covered = 0;
  for (const ShardPiece& p : opt.pieces()) {
    EXPECT_EQ(0, std::memcmp(p.param.raw(), masters.flat_slice(p.buffer_offset, {p.numel}).raw(), p.param.nbytes()));
    covered += p.numel;
  }
  EXPECT_EQ(covered, m.params().numel());
  EXPECT_DOUBLE_EQ(opt.measured_memory().main_param_bytes, 4.0);  // dp 1: no padding
  EXPECT_NE(error_of([&] { DistributedOptimizer again(ddp, {}); }).find("already released"), std::string::npos);
  // The checkpoint writer takes the masters from the optimizer; without it, it says so.
  EXPECT_NE(error_of([&] { collect_checkpoint_shards({&m}, {}, {}); }).find("distributed optimizer"),
            std::string::npos);
  EXPECT_FALSE(collect_checkpoint_shards({&m}, {.distributed = &opt}, {}).empty());
  // fp32 params are their own masters: nothing to release.
  Fixture f;
  EXPECT_THROW(f.buf->release_main_params(), Error);
  DistributedDataParallel ddp32(*f.buf, f.pc, {.bucket_size = 6, .use_distributed_optimizer = true});
  DistributedOptimizer opt32(ddp32, {});
  EXPECT_FALSE(opt32.main_params_sharded());
  EXPECT_TRUE(f.buf->has_main_params());
}

TEST(DistributedOptimizer, GradNormAndClipAtDp1MatchTheWholeBuffer) {
  Fixture f;
  DistributedDataParallel ddp(*f.buf, f.pc, {.bucket_size = 4, .use_distributed_optimizer = true});
  DistributedOptimizer opt(ddp, {});
  float* g = f.buf->grad_buffer().data<float>();
  double ss = 0;
  for (int64_t i = 0; i < f.buf->numel(); ++i) {
    g[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
    ss += double(g[i]) * g[i];
  }
  EXPECT_NEAR(opt.grad_norm(), std::sqrt(ss), 1e-6 * std::sqrt(ss));
  const double coef = opt.clip_grads(std::sqrt(ss), 0.25);
  EXPECT_NEAR(coef, 0.25 / (std::sqrt(ss) + 1e-6), 1e-12);
  EXPECT_NEAR(std::sqrt(double(ops::sum_of_squares(f.buf->grad_buffer()))), 0.25, 1e-5);
  EXPECT_EQ(opt.clip_grads(0.1, 1.0), 1.0);  // norm below max: untouched
}

// Megatron's table (docs: distributed optimizer): fp32 everywhere 16 bytes replicated, 8 + 8/d
// sharded; bf16 params with fp32 grads 18 replicated, 6 + 12/d sharded.
TEST(MemoryReport, MatchesMegatronTable) {
  EXPECT_DOUBLE_EQ(memory_report(1, false, DType::F32).total(), 16.0);
  EXPECT_DOUBLE_EQ(memory_report(8, false, DType::F32).total(), 16.0);
  EXPECT_DOUBLE_EQ(memory_report(4, true, DType::F32).total(), 8.0 + 8.0 / 4);
  EXPECT_DOUBLE_EQ(memory_report(1, false, DType::BF16).total(), 18.0);
  EXPECT_DOUBLE_EQ(memory_report(8, true, DType::BF16).total(), 6.0 + 12.0 / 8);
  const MemoryReport r = memory_report(4, true, DType::BF16);
  EXPECT_DOUBLE_EQ(r.param_bytes, 2.0);
  EXPECT_DOUBLE_EQ(r.grad_bytes, 4.0);
  EXPECT_DOUBLE_EQ(r.main_param_bytes, 1.0);
  EXPECT_DOUBLE_EQ(r.optimizer_state_bytes, 2.0);
  EXPECT_EQ(format_memory_report(memory_report(4, true, DType::F32)),
            "memory per parameter per rank (dp=4, distributed optimizer, float32 params): params 4 + grads 4 + "
            "main params 0 + optimizer state 2 = 10 bytes");
  // Context parallelism: the distributed optimizer shards over dp * cp ranks; the replicated one does not.
  EXPECT_DOUBLE_EQ(memory_report(2, true, DType::BF16, 2).total(), memory_report(4, true, DType::BF16).total());
  EXPECT_DOUBLE_EQ(memory_report(2, false, DType::BF16, 2).total(), 18.0);
  EXPECT_EQ(format_memory_report(memory_report(2, true, DType::BF16, 2)),
            "memory per parameter per rank (dp=2 x cp=2, distributed optimizer, bfloat16 params): params 2 + grads 4 "
            "+ main params 1 + optimizer state 2 = 9 bytes");
  EXPECT_THROW(memory_report(2, true, DType::F32, 0), Error);
  EXPECT_THROW(memory_report(0, true, DType::F32), Error);
  EXPECT_THROW(memory_report(2, true, DType::I32), Error);
  // Measured at dp 1: params 4 + grads 4 + state 8 exactly (no padding at dp 1).
  Fixture f;
  DistributedDataParallel ddp(*f.buf, f.pc, {.bucket_size = 6, .use_distributed_optimizer = true});
  DistributedOptimizer opt(ddp, {});
  EXPECT_DOUBLE_EQ(opt.measured_memory().total(), 16.0);
}

}  // namespace
}  // namespace mcpp
