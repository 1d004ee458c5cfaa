// TrainingConfig's field table and validate(); contract in training_config.h.
#include "mcpp/training/training_config.h"

#include "mcpp/core/error.h"
#include "mcpp/training/fault_spec.h"

namespace mcpp {

// The training loop changes no value a checkpoint's model computes: the table's default fingerprint is Never.
const config::FieldTable<TrainingConfig>& TrainingConfig::fields() {
  using Self = TrainingConfig;
  static const config::FieldTable<Self> table{
      "training", config::Fingerprint::Never,
      {
          MCPP_FIELD(micro_batch_size).flag("--micro-batch-size"),
          MCPP_FIELD(global_batch_size).flag("--global-batch-size"),
          MCPP_FIELD(train_iters).flag("--train-iters"),
          MCPP_FIELD(train_samples)
              .flag("--train-samples",
                    "sample-based training: train_samples / global_batch_size iterations (exclusive with "
                    "--train-iters)"),
          MCPP_FIELD(rampup_batch_size)
              .flag("--rampup-batch-size",
                    "START INCREMENT SAMPLES: grow the global batch from START by INCREMENT over SAMPLES (with "
                    "--train-samples)")
              .nargs(3),
          MCPP_FIELD(seed).flag("--seed"),
          MCPP_FIELD(log_interval).flag("--log-interval"),
          MCPP_FIELD(eval_interval).flag("--eval-interval"),
          MCPP_FIELD(eval_iters).flag("--eval-iters"),
          MCPP_FIELD(save_interval).flag("--save-interval"),
          MCPP_FIELD(save).flag("--save"),
          MCPP_FIELD(load).flag("--load"),
          MCPP_FIELD(no_load_optim).store_true("--no-load-optim"),
          MCPP_FIELD(no_load_rng).store_true("--no-load-rng"),
          MCPP_FIELD(finetune).store_true("--finetune"),
          MCPP_FIELD(use_checkpoint_args)
              .store_true("--use-checkpoint-args",
                          "take the model's architecture (layers, sizes, heads, norms, positions, biases, experts and "
                          "routing) from the checkpoint in --load"),
          MCPP_FIELD(override_config_check).store_true("--override-config-check"),
          MCPP_FIELD(no_verify_checksums).store_true("--no-verify-checksums"),
          MCPP_FIELD(metrics_path).flag("--metrics-path", "JSONL metrics file"),
          MCPP_FIELD(timeline)
              .flag("--timeline", "write a Chrome/Perfetto trace of the pipeline schedule (all ranks) to PATH"),
          MCPP_FIELD(async_save).store_true("--async-save", "write checkpoints from a background thread"),
          MCPP_FIELD(keep_last_n_checkpoints).flag("--keep-last-n-checkpoints", "0 keeps all"),
          MCPP_FIELD(exit_interval).flag("--exit-interval"),
          MCPP_FIELD(skip_train)
              .store_true("--skip-train",
                          "no training: evaluate the loaded model on the validation and test sets (Megatron's), no "
                          "save"),
          MCPP_FIELD(bf16).store_true("--bf16"),
          MCPP_FIELD(device).flag("--device", "auto|cpu|cuda (auto: cuda when a GPU is visible)"),
          MCPP_FIELD(fp16).store_true("--fp16"),
          MCPP_FIELD(enable_cuda_graph)
              .store_true("--enable-cuda-graph",
                          "capture the training step's forward/backward in a CUDA graph after the warm-up steps"),
          MCPP_FIELD(cuda_graph_scope).flag("--cuda-graph-scope", "full_iteration (the implemented scope)"),
          MCPP_FIELD(cuda_graph_warmup_steps).flag("--cuda-graph-warmup-steps", "eager steps before the capture"),
          MCPP_FIELD(per_rank_metrics)
              .store_false("--no-per-rank-metrics",
                           "only the last rank writes metrics (default: every rank its <metrics stem>.rank_<r>.jsonl)"),
          MCPP_FIELD(timing_log_level)
              .flag("--timing-log-level", "Megatron's timers: 0 none, 1 step phases, 2 + schedule"),
          MCPP_FIELD(timing_log_option).flag("--timing-log-option", "timers over ranks: max|minmax|all"),
          MCPP_FIELD(peak_tflops)
              .flag("--peak-tflops", "peak TFLOP/s per GPU (rank) for MFU (default: a known GPU's bf16)")
              .range(config::Range::non_negative()),
          MCPP_FIELD(log_straggler)
              .store_true("--log-straggler", "per log interval: slowest / fastest rank's step and phase times"),
          MCPP_FIELD(straggler_threshold)
              .flag("--straggler-threshold", "with --log-straggler: name ranks this % slower")
              .range(config::Range::non_negative()),
          MCPP_FIELD(tensorboard_dir).flag("--tensorboard-dir", "write TensorBoard event files here (last rank)"),
          MCPP_FIELD(tensorboard_log_interval).flag("--tensorboard-log-interval"),
          MCPP_FIELD(log_timers_to_tensorboard).store_true("--log-timers-to-tensorboard"),
          MCPP_FIELD(log_memory_to_tensorboard).store_true("--log-memory-to-tensorboard"),
          MCPP_FIELD(log_validation_ppl_to_tensorboard).store_true("--log-validation-ppl-to-tensorboard"),
          MCPP_FIELD(trace_modules)
              .flag("--trace-modules", "print iteration N's module tree (shapes, dtypes, ops)"),
          MCPP_FIELD(check_for_nan_in_loss_and_grad)
              .store_false("--no-check-for-nan-in-loss-and-grad",
                           "no re-run on a non-finite grad norm (default: re-run the step with per-module checks, "
                           "name the first non-finite tensor, skip the step)"),
          MCPP_FIELD(check_for_spiky_loss)
              .store_true("--check-for-spiky-loss", "re-run and skip a step whose loss spikes past the factor"),
          MCPP_FIELD(spiky_loss_factor)
              .flag("--spiky-loss-factor", "a spike: loss > factor x the largest of the last 100 healthy losses")
              .range(config::Range::positive()),
          MCPP_FIELD(rerun_on_cpu)
              .store_true("--rerun-on-cpu",
                          "on a NaN / spiky step also re-run it in fp32 on CPU (from the step's checkpoint or the "
                          "pre-step state) to tell a numerics problem from a device fault"),
          MCPP_FIELD(inject_fault)
              .flag("--inject-fault",
                    "KIND[:OPTS]@ITER[:RANK]: nan-grad:layer=K[,persistent] | nan-output:layer=K | kill | hang | "
                    "slow-data[:ms=N] | slow-rank[:ms=N] | wrong-collective[:extra] | bad-shard | bad-batch | "
                    "corrupt-collective (docs/DEBUGGING.md)")
              .repeatable(),
          MCPP_FIELD(check_data_consistency)
              .flag("--check-data-consistency",
                    "every N iterations hash each rank's batch: TP/CP/PP peers must agree, DP ranks see disjoint "
                    "samples; a mismatch ends the job naming the group and ranks (0: off)"),
      }};
  return table;
}

using config::require_non_negative;
using config::require_positive;

void TrainingConfig::validate() const {
  config::check_fields(fields(), *this);
  require_positive(micro_batch_size, "micro_batch_size");
  require_non_negative(global_batch_size, "global_batch_size");
  if (global_batch_size % micro_batch_size != 0)
    fail("global_batch_size ({}) must be divisible by micro_batch_size ({})", global_batch_size, micro_batch_size);
  require_non_negative(train_samples, "train_samples");
  // sample-based: train_iters is derived (Config::apply_world_size overwrites it; the flags and recipes refuse both)
  if (train_samples == 0) require_positive(train_iters, "train_iters");
  if (!rampup_batch_size.empty()) {
    if (rampup_batch_size.size() != 3)
      fail("rampup_batch_size takes 3 values (start, increment, ramp-up samples); got {}", rampup_batch_size.size());
    if (rampup_batch_size[0] <= 0 || rampup_batch_size[1] <= 0 || rampup_batch_size[2] <= 0)
      fail("rampup_batch_size: start ({}), increment ({}) and ramp-up samples ({}) must be positive",
           rampup_batch_size[0], rampup_batch_size[1], rampup_batch_size[2]);
    if (train_samples == 0)
      fail("rampup_batch_size needs sample-based training (--train-samples; Megatron's rule)");
  }
  require_non_negative(seed, "seed");
  require_positive(log_interval, "log_interval");
  require_positive(eval_interval, "eval_interval");
  require_non_negative(eval_iters, "eval_iters");
  require_non_negative(save_interval, "save_interval");
  require_non_negative(exit_interval, "exit_interval");
  require_non_negative(keep_last_n_checkpoints, "keep_last_n_checkpoints");
  if (bf16 && fp16) fail("bf16 and fp16 are both set; choose one");
  if (device != "auto" && device != "cpu" && device != "cuda")
    fail("device: unknown value '{}' (expected auto|cpu|cuda)", device);
  if (cuda_graph_scope != "full_iteration")
    fail("cuda_graph_scope: '{}' is not implemented (per-layer graphs, Megatron's full/attn scopes); use "
         "full_iteration", cuda_graph_scope);
  require_positive(cuda_graph_warmup_steps, "cuda_graph_warmup_steps");
  if (enable_cuda_graph && device == "cpu") fail("enable_cuda_graph: CUDA graphs need --device cuda (device is cpu)");
  if (enable_cuda_graph && !timeline.empty())
    fail("enable_cuda_graph: --timeline times each schedule action on the host, which a replayed graph does "
         "not run; use one or the other");
  if (timing_log_level < 0 || timing_log_level > 2)
    fail("timing_log_level must be 0, 1 or 2 (Megatron's levels), got {}", timing_log_level);
  if (timing_log_option != "max" && timing_log_option != "minmax" && timing_log_option != "all")
    fail("timing_log_option: unknown value '{}' (expected max|minmax|all)", timing_log_option);
  require_positive(tensorboard_log_interval, "tensorboard_log_interval");
  require_non_negative(trace_modules, "trace_modules");
  for (const std::string& f : inject_fault) parse_fault_spec(f);  // a malformed one: its error
  require_non_negative(check_data_consistency, "check_data_consistency");
  if (rerun_on_cpu && !check_for_nan_in_loss_and_grad && !check_for_spiky_loss)
    fail("rerun_on_cpu: nothing triggers a re-run (--no-check-for-nan-in-loss-and-grad without "
         "--check-for-spiky-loss); drop --rerun-on-cpu or turn a check on");
  if (rerun_on_cpu && enable_cuda_graph)
    fail("rerun_on_cpu: under --enable-cuda-graph a faulty step is skipped without a re-run; drop one of them");
  if (trace_modules > 0 && enable_cuda_graph)
    fail("trace_modules: the module trace records the ops as the host issues them, which a replayed CUDA graph "
         "does not; drop --enable-cuda-graph for the traced run");
}

}  // namespace mcpp
