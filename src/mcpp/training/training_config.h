// TrainingConfig: the training loop (Megatron's --micro-batch-size, --train-iters, --save, --load, ...; the training
// section of the config JSON / TOML). Fields declared once in fields() (core/config_fields.h); validate() checks
// its own fields (one-line mcpp::Error naming the field); rules across configs are config.h's (Config).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mcpp/core/config_fields.h"

namespace mcpp {

struct TrainingConfig {
  int64_t micro_batch_size = 4;
  int64_t global_batch_size = 0;  // 0 -> micro_batch_size * dp (Config::apply_world_size)
  int64_t train_iters = 100;
  // Sample-based training (Megatron's --train-samples; exclusive with --train-iters): train_iters is then derived,
  // train_samples / global_batch_size after a ramp-up's batches (Config::apply_world_size overwrites it; the parsed
  // flags leave it 0 until then), and the LR schedule's lengths are OptimizerConfig's *_samples.
  int64_t train_samples = 0;
  // Megatron's --rampup-batch-size START INCREMENT SAMPLES (sample-based training only): the global batch starts at
  // START and grows by INCREMENT in equal steps over SAMPLES consumed samples, then stays global_batch_size
  // (num_microbatches_calculator.cpp: Config::global_batch_size_at); empty: off.
  std::vector<int64_t> rampup_batch_size;
  int64_t seed = 1234;
  int64_t log_interval = 10;
  int64_t eval_interval = 1000;
  int64_t eval_iters = 10;
  int64_t save_interval = 0;  // 0 -> save at the end only (when --save is given)
  std::string save;
  std::string load;
  bool no_load_optim = false;
  bool no_load_rng = false;
  bool finetune = false;
  bool use_checkpoint_args = false;  // --use-checkpoint-args: the architecture from --load's checkpoint (arguments.cpp)
  bool override_config_check = false;  // load a checkpoint of a different model (warns)
  bool no_verify_checksums = false;    // --no-verify-checksums: skip xxh3 checks while loading
  std::string metrics_path;  // JSONL; default <save>/metrics.jsonl when save is set
  std::string timeline;      // Chrome/Perfetto trace of the pipeline schedule (all ranks); empty = off
  bool async_save = false;   // --async-save: snapshot at the step boundary, written by a background thread
  int64_t keep_last_n_checkpoints = 0;  // --keep-last-n-checkpoints: delete older committed ones; 0 = keep all
  int64_t exit_interval = 0;
  // Megatron's --skip-train: no training step (nor save); the end-of-training evaluations of the validation and test
  // sets run on the loaded model (from the checkpoint's consumed validation samples).
  bool skip_train = false;
  bool bf16 = false;  // --bf16: bf16 params/activations with fp32 main params and grads (CUDA only)
  // --device: where the model trains. "auto" = cuda when this build has CUDA and a GPU is visible, else
  // cpu; "cuda" without a GPU is an error.
  std::string device = "auto";
  bool fp16 = false;  // --fp16: accepted for Megatron parity; exclusive with bf16
  // --enable-cuda-graph: capture the training step's forward/backward (all microbatches, zero_grad and the
  // grad sync) in a CUDA graph after cuda_graph_warmup_steps eager steps, then replay it; the optimizer
  // step stays eager. Scope "full_iteration" (Megatron's name) is the one implemented.
  bool enable_cuda_graph = false;
  std::string cuda_graph_scope = "full_iteration";
  int64_t cuda_graph_warmup_steps = 3;
  // ---- observability (training/: rank_metrics.h, timers.h, flops.h, tensorboard.h; core/module_trace.h;
  // docs/OBSERVABILITY.md)
  bool per_rank_metrics = true;               // <metrics stem>.rank_<r>.jsonl on every rank; --no-per-rank-metrics
  int64_t timing_log_level = 0;               // Megatron's --timing-log-level 0|1|2
  std::string timing_log_option = "minmax";   // Megatron's --timing-log-option max|minmax|all
  double peak_tflops = 0.0;                   // --peak-tflops: MFU's peak per GPU/rank (0: a known GPU's bf16 peak)
  bool log_straggler = false;                 // Megatron's --log-straggler: the per-interval straggler report
  double straggler_threshold = 10.0;          // --straggler-threshold PCT: a rank this much slower is named
  std::string tensorboard_dir;                // Megatron's --tensorboard-dir (empty: off)
  int64_t tensorboard_log_interval = 1;       // Megatron's --tensorboard-log-interval
  bool log_timers_to_tensorboard = false;     // Megatron's --log-timers-to-tensorboard
  bool log_memory_to_tensorboard = false;     // Megatron's --log-memory-to-tensorboard
  bool log_validation_ppl_to_tensorboard = false;  // Megatron's --log-validation-ppl-to-tensorboard
  int64_t trace_modules = 0;                  // --trace-modules N: iteration N's module tree (0: off)
  // ---- diagnosis (training/nan_localizer.h, training/fault_injection.h; docs/DEBUGGING.md)
  bool check_for_nan_in_loss_and_grad = true;  // Megatron's; a non-finite grad norm -> re-run + localise + skip
  bool check_for_spiky_loss = false;           // Megatron's: a loss > spiky_loss_factor x recent max -> the same
  double spiky_loss_factor = 10.0;             // Megatron's SPIKY_LOSS_FACTOR (a constant there)
  bool rerun_on_cpu = false;  // --rerun-on-cpu: a faulty step also re-runs in fp32 on CPU (trainer_cpu_rerun.cpp)
  std::vector<std::string> inject_fault;       // --inject-fault KIND[:OPTS]@ITER[:RANK] (repeatable)
  int64_t check_data_consistency = 0;          // --check-data-consistency N: every N iterations (data_consistency.h)

  static const config::FieldTable<TrainingConfig>& fields();
  void validate() const;
};

}  // namespace mcpp
