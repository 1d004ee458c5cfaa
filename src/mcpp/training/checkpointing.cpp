#include "mcpp/training/checkpointing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/optimizer/adam.h"
#include "mcpp/optimizer/distributed_optimizer.h"

#include <map>

namespace mcpp {

namespace dc = dist_checkpointing;

namespace {

constexpr const char* kExpAvg = "optimizer.exp_avg.";
constexpr const char* kExpAvgSq = "optimizer.exp_avg_sq.";

// Refuses a checkpoint whose model math differs from `config`, naming the fields.
void check_fingerprint(const nlohmann::json& meta, const Config& config, const std::string& dir, bool override_check) {
  // Checkpoints written by `mcpp ckpt import` carry only the config: derive its math fields.
  nlohmann::json saved;
  if (meta.contains("math_fields")) {
    saved = meta["math_fields"];
  } else if (meta.contains("config")) {
    Config c = Config::from_json(meta["config"]);
    c.finalize();
    saved = c.math_fields();
  } else {
    fail("checkpoint '{}': manifest meta holds neither math_fields nor config", dir);
  }
  if (meta.value("fingerprint", "") == config.fingerprint()) return;
  std::vector<std::string> diff = diff_math_fields(saved, config.math_fields());
  if (diff.empty()) return;  // same fields, fingerprint of an older encoding: accept
  std::string what = fmt::format("{}", fmt::join(diff, "; "));
  if (!override_check)
    fail("checkpoint '{}' was saved for a different model (checkpoint vs now: {}); "
         "--override-config-check loads it anyway",
         dir, what);
  spdlog::warn("loading checkpoint '{}' of a different model because of --override-config-check: {}", dir, what);
}

// The logical tensor of a TP-sharded local tensor: each TP rank places its shard into zeros, then an
// all-reduce (sum) over TP assembles it on every TP rank. Replicated tensors are returned as they are.
Tensor logical_tensor(const Tensor& local, const ParamSpec& spec, comm::Communicator& tp) {
  Tensor host = local.to(Device::CPU);
  if (!spec.shard.partitioned()) return host;
  Tensor full = Tensor::zeros(spec.shard.global_shape);
  copy_shard_to_global(full, host, spec.shard);
  tp.all_reduce(full, comm::ReduceOp::Sum).wait();
  return full;
}

// Reads the logical tensor `key` and keeps this rank's shard of it in `dst`.
void read_shard(const dc::CheckpointReader& reader, const std::string& key, const ParamSpec& spec, Tensor& dst) {
  if (!reader.has(key)) fail("checkpoint '{}' has no tensor '{}' (the model needs it)", reader.dir(), key);
  if (!spec.shard.partitioned()) {
    reader.read_into(key, dst);
    return;
  }
  Tensor full = reader.read(key);
  if (full.shape() != spec.shard.global_shape)
    fail("checkpoint '{}': tensor '{}' has shape {}, the model needs {}", reader.dir(), key, shape_str(full.shape()),
         shape_str(spec.shard.global_shape));
  Tensor local = Tensor::empty(spec.shape);
  copy_shard_from_global(local, full, spec.shard);
  dst.copy_from(local);
}

// The distributed optimizer's moments of each parameter as full TP-local tensors: every DP rank places the
// pieces it owns into zeros; an all-reduce (sum) over dp_cp assembles them (the pieces are disjoint).
std::map<std::string, std::pair<Tensor, Tensor>> gather_distributed_state(const DistributedOptimizer& opt,
                                                                          GPTModel& model,
                                                                          const parallel_state::ParallelContext& pc) {
  std::map<std::string, std::pair<Tensor, Tensor>> out;
  for (const auto& p : model.params().params())
    out[p->spec.key] = {Tensor::zeros(p->spec.shape), Tensor::zeros(p->spec.shape)};
  for (const DistOptStatePiece& piece : opt.state()) {
    auto& [m, v] = out.at(piece.key);
    m.view({-1}).flat_slice(piece.offset, {piece.numel}).copy_from(piece.exp_avg);
    v.view({-1}).flat_slice(piece.offset, {piece.numel}).copy_from(piece.exp_avg_sq);
  }
  if (pc.dp_cp()->size() > 1)
    for (auto& [key, mv] : out) {
      pc.dp_cp()->all_reduce(mv.first, comm::ReduceOp::Sum).wait();
      pc.dp_cp()->all_reduce(mv.second, comm::ReduceOp::Sum).wait();
    }
  return out;
}

void read_model(const dc::CheckpointReader& reader, GPTModel& model) {
  for (const auto& p : model.params().params()) read_shard(reader, p->spec.key, p->spec, p->data);
}

}  // namespace

std::string save_training_checkpoint(const std::string& save_dir, const Config& config, GPTModel& model,
                                     OptimizerRef optimizer, const TrainerState& state,
                                     const parallel_state::ParallelContext& pc) {
  const bool writer = pc.rank() == 0;  // DP replicas are identical; rank 0 holds TP rank 0's view
  comm::Communicator& tp = *pc.tp();
  dc::CheckpointContents c;
  c.iteration = state.iteration;
  for (const auto& p : model.params().params()) {
    Tensor full = logical_tensor(p->data, p->spec, tp);
    if (writer) c.tensors.push_back({p->spec.key, full});
  }
  nlohmann::json opt_meta = nullptr;
  auto add_moments = [&](const std::string& key, const Tensor& m_local, const Tensor& v_local) {
    const ParamSpec& spec = model.params().find(key)->spec;
    Tensor m = logical_tensor(m_local, spec, tp), v = logical_tensor(v_local, spec, tp);
    if (!writer) return;
    c.tensors.push_back({kExpAvg + key, m});
    c.tensors.push_back({kExpAvgSq + key, v});
  };
  if (optimizer.adam) {
    for (const AdamState& s : optimizer.adam->state()) add_moments(s.name, s.exp_avg, s.exp_avg_sq);
    opt_meta = {{"step", optimizer.adam->step_count()}};
  } else if (optimizer.distributed) {
    auto moments = gather_distributed_state(*optimizer.distributed, model, pc);
    for (const auto& p : model.params().params()) {  // parameter order on every rank (collectives line up)
      const auto& [m, v] = moments.at(p->spec.key);
      add_moments(p->spec.key, m, v);
    }
    opt_meta = {{"step", optimizer.distributed->step_count()}, {"distributed", true}};
  }
  c.meta = {{"config", config.to_json()},
            {"fingerprint", config.fingerprint()},
            {"math_fields", config.math_fields()},
            {"iteration", state.iteration},
            {"consumed_train_samples", state.consumed_train_samples},
            {"consumed_valid_samples", state.consumed_valid_samples},
            {"optimizer", opt_meta},
            {"opt_param_scheduler", state.scheduler},
            {"rng", state.rng.state()},
            {"parallel", {{"world_size", pc.world_size()}, {"tp", pc.tp_size()}, {"pp", pc.pp_size()},
                          {"dp", pc.dp_size()}, {"cp", pc.cp_size()}}}};
  // Rank 0 writes; the others learn the outcome so that a failed save is an error on every rank.
  std::string dir, error;
  if (writer) {
    try {
      dir = dc::save_checkpoint(save_dir, c);
    } catch (const Error& e) {
      error = e.what();
    }
  }
  Tensor ok = Tensor::empty({1}, DType::I32);
  ok.data<int32_t>()[0] = error.empty() ? 1 : 0;
  pc.world()->broadcast(ok, 0).wait();
  if (ok.data<int32_t>()[0] == 0)
    fail("saving checkpoint iteration {} to '{}' failed{}", state.iteration, save_dir,
         error.empty() ? " on rank 0" : ": " + error);
  return writer ? dir : save_dir + "/" + dc::iteration_dir_name(state.iteration);
}

bool load_training_checkpoint(const std::string& load_dir, const Config& config, GPTModel& model,
                              OptimizerRef optimizer, TrainerState& state, const LoadOptions& opt) {
  if (dc::latest_iteration(load_dir) < 0 && dc::list_iterations(load_dir).empty()) return false;
  dc::CheckpointReader reader(load_dir);
  const nlohmann::json& meta = reader.meta();
  check_fingerprint(meta, config, reader.dir(), opt.override_config_check);
  read_model(reader, model);
  if (opt.finetune) {
    state = TrainerState{.rng = state.rng};
    return true;
  }
  state.iteration = meta.at("iteration").get<int64_t>();
  state.consumed_train_samples = meta.at("consumed_train_samples").get<int64_t>();
  state.consumed_valid_samples = meta.value("consumed_valid_samples", int64_t{0});
  state.scheduler = meta.value("opt_param_scheduler", nlohmann::json::object());
  if (opt.load_rng) {
    state.rng.load_state(meta.at("rng"));
  }
  if (!optimizer.empty() && opt.load_optimizer) {
    if (meta.at("optimizer").is_null())
      fail("checkpoint '{}' holds no optimizer state; use --no-load-optim (or --finetune) to load weights only",
           reader.dir());
    const int64_t step = meta.at("optimizer").at("step").get<int64_t>();
    if (optimizer.distributed) {
      // Each piece: the logical moment -> this rank's TP shard -> the piece's flat range.
      std::map<std::string, std::pair<Tensor, Tensor>> cache;
      optimizer.distributed->load_state(
          step, [&](const std::string& key, int64_t offset, Tensor& exp_avg, Tensor& exp_avg_sq) {
            if (!reader.has(kExpAvg + key) || !reader.has(kExpAvgSq + key)) return false;
            auto it = cache.find(key);
            if (it == cache.end()) {
              const ParamSpec& spec = model.params().find(key)->spec;
              Tensor m = Tensor::empty(spec.shape), v = Tensor::empty(spec.shape);
              read_shard(reader, kExpAvg + key, spec, m);
              read_shard(reader, kExpAvgSq + key, spec, v);
              it = cache.emplace(key, std::make_pair(m.view({-1}), v.view({-1}))).first;
            }
            exp_avg.copy_from(it->second.first.flat_slice(offset, {exp_avg.numel()}));
            exp_avg_sq.copy_from(it->second.second.flat_slice(offset, {exp_avg_sq.numel()}));
            return true;
          });
      return true;
    }
    optimizer.adam->load_state(step,
                          [&](const std::string& name, Tensor& exp_avg, Tensor& exp_avg_sq) {
                            if (!reader.has(kExpAvg + name) || !reader.has(kExpAvgSq + name)) return false;
                            const ParamSpec& spec = model.params().find(name)->spec;
                            read_shard(reader, kExpAvg + name, spec, exp_avg);
                            read_shard(reader, kExpAvgSq + name, spec, exp_avg_sq);
                            return true;
                          });
  }
  return true;
}

LoadedModel load_model_for_inference(const std::string& load_dir) {
  dc::CheckpointReader reader(load_dir);
  LoadedModel lm;
  if (!reader.meta().contains("config")) fail("checkpoint '{}': manifest meta lacks the model config", reader.dir());
  lm.config = Config::from_json(reader.meta().at("config"));
  lm.config.finalize();
  lm.config.model.hidden_dropout = 0.0f;  // inference never drops; a flash model then accepts any recipe
  lm.config.model.attention_dropout = 0.0f;
  lm.config.model.validate();
  lm.iteration = reader.iteration();
  lm.model = std::make_unique<GPTModel>(lm.config.model, static_cast<uint64_t>(lm.config.training.seed),
                                        tensor_parallel::TPContext{comm::make_local_world(), false});
  read_model(reader, *lm.model);
  return lm;
}

}  // namespace mcpp
