// Training progress output: the Megatron-LM log line on stdout and one JSON object per logged
// iteration in a JSONL file (machine-readable twin of the log line; also eval and checkpoint events).
#pragma once
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace mcpp {

struct IterationStats {
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  double elapsed_ms_per_iter = 0;
  double tokens_per_sec = 0;
  double learning_rate = 0;       // the lr the window's last optimizer step applied (metrics "learning_rate")
  // The lr after that step's scheduler step, i.e. the next iteration's: what Megatron's log line prints (it reads
  // the param groups after opt_param_scheduler.step); "learning rate:" in the log line, metrics "next_learning_rate".
  double next_learning_rate = 0;
  int64_t global_batch_size = 0;
  double lm_loss = 0;
  double grad_norm = 0;
  int64_t skipped_iters = 0;
  int64_t nan_iters = 0;
  // MoE models: Megatron's load_balancing_loss (or seq_load_balancing_loss with the seq_aux_loss type) / z_loss
  // (the router losses over their coefficients, averaged over layers, microbatches, iterations of the window and
  // ranks); unset when the loss is off.
  std::optional<double> load_balancing_loss, seq_load_balancing_loss, z_loss;
  // --moe-per-layer-logging: the same per MoE layer (global index; the metrics record's "moe_layers")
  struct MoeLayerLosses {
    int64_t layer = 0;
    std::optional<double> load_balancing_loss, seq_load_balancing_loss, z_loss;
  };
  std::vector<MoeLayerLosses> moe_layers;
  // Multi-token prediction: Megatron's "mtp_<k> loss" per depth k = 1.. (the depth's mean loss, averaged over
  // microbatches, iterations of the window and data-parallel ranks); empty without MTP.
  std::vector<double> mtp_losses;
};

// " [2026-11-30 08:00:00] iteration       10/     100 | consumed samples: ... | lm loss: 5.1E+00 | ..."
std::string format_log_line(const IterationStats& s);

class MetricsWriter {
 public:
  MetricsWriter() = default;
  explicit MetricsWriter(const std::string& path);  // appends; empty path = disabled
  void write(const nlohmann::json& record);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

nlohmann::json to_json(const IterationStats& s);

}  // namespace mcpp
