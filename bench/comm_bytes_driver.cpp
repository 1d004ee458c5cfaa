// comm_bytes_driver: one training step of a small GPT under mpiexec, and the communication it issued,
// counted by the flight recorder and summed per (group, op). bench/comm_bytes.py runs it at several
// layouts and compares the sums with the analytic formulas (docs/PERF.md, "Distributed runtime").
//
// Contract:
//   usage: mpiexec -np W comm_bytes_driver --tp T [--sp] [--distopt] [--layers L] [--micro-batch b]
//   W % T == 0, DP = W / T. Model: GPT-2 style (LayerNorm, GELU MLP, learned positions, tied output),
//   hidden 32, 8 heads, ffn 64, seq 8, padded vocab 128, one DDP bucket (default bucket size), fp32.
//   The step is what the trainer does for one iteration with one microbatch: (distopt: wait_param_gather),
//   zero_grad, forward_loss + backward, finish_grad_sync, finalize_model_grads, DP loss average (1 float
//   on "dp", Trainer::dp_mean), grad norm, clip, optimizer step (distopt: + the param all-gather, waited).
//   A warm-up step runs first; only the second step's recorder entries are counted.
//   Output (rank 0, one JSON object on stdout):
//     {"tp", "dp", "sp", "distopt", "layers", "hidden", "ffn", "seq", "micro_batch", "padded_vocab",
//      "max_pos", "local_params": <numel of this rank's model shard>,
//      "sp_param_numel": <numel of params marked sequence_parallel (LayerNorms)>,
//      "buckets": [[numel, padded_numel], ...],
//      "measured": {"<group>": {"<op>": {"calls": n, "elements": sum count, "bytes": sum count*dtype size}}}}
//   The recorder's count is the elements this rank contributes (the input numel), so an all-gather of
//   [s/t, b, h] counts s*b*h/t and a reduce-scatter of [s, b, h] counts s*b*h. Every rank checks that
//   every entry of the step completed ("done"); a bad flag is an mcpp::Error (exit 2).
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/comm/mpi/mpi_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/distributed/data_parallel.h"
#include "mcpp/distributed/finalize_grads.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/optimizer/distributed_optimizer.h"
#include "mcpp/parallel_state/parallel_context.h"

namespace mcpp {
namespace {

struct Args {
  int tp = 1, layers = 2;
  int64_t micro_batch = 2;
  bool sp = false, distopt = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      MCPP_CHECK(i + 1 < argc, "comm_bytes_driver: flag {} needs a value", f);
      return argv[++i];
    };
    if (f == "--tp") a.tp = std::stoi(value());
    else if (f == "--layers") a.layers = std::stoi(value());
    else if (f == "--micro-batch") a.micro_batch = std::stoll(value());
    else if (f == "--sp") a.sp = true;
    else if (f == "--distopt") a.distopt = true;
    else fail("comm_bytes_driver: unknown flag {}", f);
  }
  MCPP_CHECK(a.tp >= 1 && a.layers >= 1 && a.micro_batch >= 1, "comm_bytes_driver: --tp, --layers, --micro-batch must be >= 1");
  return a;
}

TransformerConfig config(const Args& a) {
  TransformerConfig c;
  c.num_layers = a.layers;
  c.hidden_size = 32;
  c.num_attention_heads = 8;
  c.num_query_groups = 8;
  c.kv_channels = 4;
  c.ffn_hidden_size = 64;
  c.seq_length = 8;
  c.max_position_embeddings = 16;
  c.vocab_size = 100;
  c.padded_vocab_size = 128;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  return c;
}

size_t dtype_bytes(const std::string& d) {
  if (d == "float32" || d == "int32") return 4;
  if (d == "bfloat16" || d == "float16") return 2;
  if (d == "int64") return 8;
  return 0;  // barrier
}

int run(int argc, char** argv) {
  const Args a = parse(argc, argv);
  comm::CommPtr world = comm::world();
  MCPP_CHECK(world->size() % a.tp == 0, "comm_bytes_driver: world size {} not divisible by --tp {}", world->size(), a.tp);
  parallel_state::ParallelOptions po;
  po.tensor_model_parallel_size = a.tp;
  parallel_state::ParallelContext pc = parallel_state::ParallelContext::create(world, po);
  const TransformerConfig c = config(a);
  const bool sp = a.sp && a.tp > 1;
  ModelChunk model(c, 42, {pc.tp(), sp});
  DistributedDataParallel ddp(model.params(), pc, {.use_distributed_optimizer = a.distopt});
  const AdamOptions adam{.eps = 1e-4f, .weight_decay = 0.1f};
  std::optional<Adam> plain;
  std::optional<DistributedOptimizer> dopt;
  if (a.distopt) dopt.emplace(ddp, DistributedOptimizerOptions{adam, false});
  else {
    std::vector<AdamParam> ps;
    for (const auto& p : model.params().params())
      ps.push_back({.name = p->spec.key, .param = p->data, .main_grad = p->main_grad,
                    .no_weight_decay = p->spec.no_weight_decay});
    plain.emplace(ps, adam);
  }
  const int64_t s = c.seq_length, b = a.micro_batch;
  Tensor tokens = Tensor::empty({s, b}, DType::I32), labels = Tensor::empty({s, b}, DType::I32),
         mask = Tensor::empty({s, b});
  for (int64_t i = 0; i < s * b; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + pc.dp_rank() * 11 + 5) % 100);
    labels.data<int32_t>()[i] = static_cast<int32_t>((i * 53 + pc.dp_rank() * 29 + 3) % 100);
    mask.data<float>()[i] = 1.0f;
  }

  auto step = [&]() {
    if (dopt) dopt->wait_param_gather();
    ddp.zero_grad();
    ddp.set_is_last_microbatch(true);
    GPTModelCtx ctx;
    const LossResult r = model.forward_loss(ctx, tokens, labels, mask, {.training = false});
    model.backward(ctx, 1.0f);
    ddp.finish_grad_sync();
    finalize_model_grads(model.params(), pc, true);
    if (pc.dp_size() > 1) {  // Trainer::dp_mean of the loss
      Tensor t = Tensor::empty({1});
      t.data<float>()[0] = static_cast<float>(r.loss);
      pc.dp()->all_reduce(t, comm::ReduceOp::Avg).wait();
    }
    const double norm = dopt ? dopt->grad_norm() : model_grad_norm(model.params(), pc);
    if (dopt) {
      dopt->clip_grads(norm, 1.0);
      dopt->step(1e-3f);
    } else {
      clip_grads_by_total_norm(model.params(), norm, 1.0);
      plain->step(1e-3f);
    }
  };
  step();  // warm-up
  comm::FlightRecorder* rec = world->recorder();
  const uint64_t first = rec->total_recorded();
  step();
  const std::vector<comm::RecordEntry> entries = rec->entries();
  MCPP_CHECK(rec->total_recorded() - first <= rec->capacity(), "comm_bytes_driver: the step overflowed the recorder ring");

  nlohmann::json measured = nlohmann::json::object();
  for (const comm::RecordEntry& e : entries) {
    if (e.id < first) continue;
    MCPP_CHECK(e.state == comm::EntryState::Done, "comm_bytes_driver: {} {} #{} did not complete (state {})", e.group,
               e.op, e.seq, comm::entry_state_name(e.state));
    nlohmann::json& slot = measured[e.group][e.op];
    if (slot.is_null()) slot = {{"calls", 0}, {"elements", 0}, {"bytes", 0}};
    slot["calls"] = slot["calls"].get<int64_t>() + 1;
    slot["elements"] = slot["elements"].get<int64_t>() + e.count;
    slot["bytes"] = slot["bytes"].get<int64_t>() + e.count * static_cast<int64_t>(dtype_bytes(e.dtype));
  }
  int64_t sp_numel = 0;
  for (const auto& p : model.params().params())
    if (p->spec.sequence_parallel) sp_numel += p->data.numel();
  nlohmann::json buckets = nlohmann::json::array();
  for (const Bucket& bk : ddp.buckets()) buckets.push_back({bk.numel(), bk.padded_numel});
  nlohmann::json out = {{"tp", a.tp},
                        {"dp", pc.dp_size()},
                        {"sp", sp},
                        {"distopt", a.distopt},
                        {"layers", c.num_layers},
                        {"hidden", c.hidden_size},
                        {"ffn", c.ffn_hidden_size},
                        {"seq", s},
                        {"micro_batch", b},
                        {"padded_vocab", c.padded_vocab_size},
                        {"max_pos", c.max_position_embeddings},
                        {"local_params", model.params().numel()},
                        {"sp_param_numel", sp_numel},
                        {"buckets", buckets},
                        {"measured", measured}};
  if (world->rank() == 0) std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace mcpp

int main(int argc, char** argv) {
  mcpp::comm::init_mpi(argc, argv);
  int rc = 0;
  try {
    rc = mcpp::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    rc = 2;
  }
  if (rc != 0) {
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, rc);
  }
  mcpp::comm::finalize_mpi();
  return rc;
}
