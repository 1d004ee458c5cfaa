#include "mcpp/training/checkpointing.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/optimizer/adam.h"

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

void read_model(const dc::CheckpointReader& reader, GPTModel& model) {
  for (const auto& p : model.params().params()) {
    if (!reader.has(p->spec.key))
      fail("checkpoint '{}' has no tensor '{}' (the model needs it)", reader.dir(), p->spec.key);
    reader.read_into(p->spec.key, p->data);
  }
}

}  // namespace

std::string save_training_checkpoint(const std::string& save_dir, const Config& config, GPTModel& model,
                                     const Adam* optimizer, const TrainerState& state) {
  dc::CheckpointContents c;
  c.iteration = state.iteration;
  for (const auto& p : model.params().params()) c.tensors.push_back({p->spec.key, p->data.to(Device::CPU)});
  nlohmann::json opt_meta = nullptr;
  if (optimizer) {
    for (const AdamState& s : optimizer->state()) {
      c.tensors.push_back({kExpAvg + s.name, s.exp_avg.to(Device::CPU)});
      c.tensors.push_back({kExpAvgSq + s.name, s.exp_avg_sq.to(Device::CPU)});
    }
    opt_meta = {{"step", optimizer->step_count()}};
  }
  c.meta = {{"config", config.to_json()},
            {"fingerprint", config.fingerprint()},
            {"math_fields", config.math_fields()},
            {"iteration", state.iteration},
            {"consumed_train_samples", state.consumed_train_samples},
            {"consumed_valid_samples", state.consumed_valid_samples},
            {"optimizer", opt_meta},
            {"opt_param_scheduler", state.scheduler},
            {"rng", state.rng.state()}};
  return dc::save_checkpoint(save_dir, c);
}

bool load_training_checkpoint(const std::string& load_dir, const Config& config, GPTModel& model, Adam* optimizer,
                              TrainerState& state, const LoadOptions& opt) {
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
  if (optimizer && opt.load_optimizer) {
    if (meta.at("optimizer").is_null())
      fail("checkpoint '{}' holds no optimizer state; use --no-load-optim (or --finetune) to load weights only",
           reader.dir());
    optimizer->load_state(meta.at("optimizer").at("step").get<int64_t>(),
                          [&](const std::string& name, Tensor& exp_avg, Tensor& exp_avg_sq) {
                            if (!reader.has(kExpAvg + name) || !reader.has(kExpAvgSq + name)) return false;
                            reader.read_into(kExpAvg + name, exp_avg);
                            reader.read_into(kExpAvgSq + name, exp_avg_sq);
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
