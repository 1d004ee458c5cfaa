// The pretraining loop (Megatron-LM's training.py: pretrain / train / train_step / evaluate) on one
// rank of a ParallelContext (tensor + sequence + pipeline + data parallel; one process is the size-1
// context). With pipeline parallelism the rank holds one model chunk per virtual stage (layer placement:
// pipeline_parallel/layout.h) and runs its schedule (1F1B or interleaved: schedules.h, schedule_runner.h).
//   iteration: zero main grads -> for each local microbatch m: rows [dp_rank*mbs, +mbs) of the m-th
//   mbs*dp slice of the global batch, forward (dropout on) + backward with grad scale 1/num_microbatches
//   -> DP gradient reduction (DistributedDataParallel: average over DP per bucket, overlapped with the last
//   microbatch's backward with --overlap-grad-reduce; reduce-scatter with --use-distributed-optimizer)
//   -> finalize_model_grads (SP norm grads over TP) -> grad norm (each param once) + clip -> Adam step at
//   the scheduled LR (sharded + param all-gather with the distributed optimizer; skipped, and counted,
//   when the norm is not finite) -> scheduler step.
// --calculate-per-token-loss: each microbatch back-propagates its token sum (grad scale 1); after the DP
// reduction the gradients are divided by the non-masked tokens of the whole global batch (all microbatches,
// all DP ranks) and the logged loss is sum(loss * mask) / that count (Megatron). At pp > 1 the end of
// training prints (and writes to the JSONL) the per-stage activation memory (activation_report.h).
// The last rank prints Megatron's log line every log_interval and writes the JSONL metrics; evaluation
// on the valid split every eval_interval; checkpoints every save_interval and at the end (collective,
// sharded: every rank writes its own shards of every model chunk, training/checkpointing.h; with
// --async-save the step pauses only for the snapshot, the write runs in the background and the vote +
// commit happen at a later step boundary or at the end; --keep-last-n-checkpoints prunes after each
// commit). Deterministic given --seed: a run resumed from iteration k reproduces the uninterrupted
// run's losses bit for bit on CPU (per-rank RNG states restore when the layout is unchanged).
// Device (--device auto|cpu|cuda): the model, its buffers and the optimizer state live on one device;
// batches are built on the host and moved by the model. --bf16 (CUDA only): bf16 params and
// activations, fp32 main params (the optimizer's) and main grads. The loss statistics of each microbatch
// stay on the device (one read per step, after the backward).
// --enable-cuda-graph (CUDA; Megatron's full_iteration scope): every microbatch's batch is copied into
// static device buffers; the first cuda_graph_warmup_steps steps run eagerly (they build the cuBLASLt /
// cuDNN plans and workspaces), the next one captures zero_grad + the schedule's forward/backward + the DP
// grad sync into a CudaGraph (core/cuda_graph.h) and every step from then on replays it. The loss
// statistics land in a static [M, 2] buffer; the grad norm, clipping, optimizer and scheduler run
// eagerly after the replay. Evaluation runs eagerly. Dropout keys are graph-safe from the capture on
// (RngTracker::begin_graph_capture): their offsets are relative to a device base the trainer sets to the
// streams' offsets before each replay, and the host tracker advances by one step's draws after it, so the
// masks (and a checkpoint's RNG state) are those of the eager run.
// Files: trainer.cpp (setup), trainer_data.cpp (datasets, batches), trainer_step.cpp (one step), trainer_loop.cpp
// (the loop, evaluation), trainer_checkpoint.cpp (saves), trainer_reports.cpp (the log line's collective parts and
// the end-of-training reports), trainer_diagnosis.cpp (the NaN / spiky-loss re-run) and trainer_cpu_rerun.cpp (its
// --rerun-on-cpu part).
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/datasets/megatron_dataset.h"
#include "mcpp/dist_checkpointing/retention.h"
#include "mcpp/distributed/model_chunk.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/training/checkpointing.h"
#include "mcpp/training/fault_injection.h"
#include "mcpp/training/nan_localizer.h"
#include "mcpp/training/activation_report.h"
#include "mcpp/training/metrics.h"
#include "mcpp/training/rank_metrics.h"
#include "mcpp/training/tensorboard.h"
#include "mcpp/training/data_consistency.h"
#include "mcpp/training/timers.h"
#include "mcpp/tools/memory_planner.h"
#include "mcpp/training/config.h"

namespace mcpp {
namespace timeline { class TimelineRecorder; }
namespace dist_checkpointing { class AsyncCheckpointSaver; }

class Adam;
class OptimizerParamScheduler;
class DistributedDataParallel;
class DistributedOptimizer;

struct TrainSummary {
  int64_t iterations_run = 0;
  int64_t final_iteration = 0;
  std::vector<double> losses;     // lm loss of each iteration run (mean over DP), for tests / tools
  std::vector<double> grad_norms;  // the global grad norm of each iteration run (before clipping)
  double last_valid_loss = -1;    // -1 when no evaluation ran (the last one at an eval_interval)
  // The end-of-training evaluations (Megatron's pretrain after train(): "on validation set", "on test set"; not after
  // --exit-interval): -1 when not run (no such split, eval_iters 0).
  double end_valid_loss = -1, test_loss = -1;
  int64_t cuda_graph_replays = 0;  // training steps run by replaying the captured CUDA graph
  int64_t cuda_graph_nodes = 0;    // nodes of that graph (0: none captured)
};

// --device resolved: "cpu" / "cuda" (an error without a visible GPU) / "auto" (cuda when available).
Device resolve_training_device(const TrainingConfig& t);

class Trainer {
 public:
  // config: finalized, validated for training, apply_world_size(world) done, vocab set from the tokenizer.
  // eod_token: the tokenizer's EOD id (for --eod-mask-loss). pc: this rank's parallel context.
  Trainer(const Config& config, int64_t eod_token, parallel_state::ParallelContext pc);
  ~Trainer();
  TrainSummary train();
  // What evaluate() runs: an eval_interval's validation, or the end of training's (Megatron's pretrain after train():
  // "on validation set" / "on test set").
  enum class Eval { Interval, EndValidation, EndTest };
  // The mean lm loss over eval_iters global batches: of the valid split from consumed_valid_samples, or (EndTest) of
  // the test split from its first sample; -1 without the split.
  double evaluate(int64_t iteration, Eval which = Eval::Interval);
  ModelChunk& model() { return *chunks_.front(); }

 private:
  struct Batch {
    Tensor tokens, labels, loss_mask;  // [s, b]
    PackedSeqParams packed{};          // --sft / --reset-position-ids / --reset-attention-mask (host), or none
  };
  // The train / valid / test datasets (the constructor's; trainer_data.cpp).
  void build_datasets(int64_t eod_token);
  // Micro batch `m` of the global batch starting at sample `first` (this DP rank's rows). training: a training
  // step's (--inject-fault bad-batch, --check-data-consistency's digests), not an evaluation's.
  Batch get_batch(const MegatronDataset& ds, int64_t first, int64_t m, bool training);
  // One schedule over all microbatches of a global batch: training (forward + backward) or evaluation.
  struct StepLoss {
    double mean_loss = 0;  // mean over microbatches of each microbatch's mean loss (last stage)
    double masked_loss_sum = 0, num_tokens = 0;
  };
  // num_micro: microbatches per DP rank of this global batch (a --rampup-batch-size ramp changes it).
  StepLoss run_microbatches(const MegatronDataset& ds, int64_t first, bool forward_only, int64_t num_micro);
  // zero_grad + run_microbatches (training) + the DP grad sync: the region a CUDA graph captures.
  StepLoss forward_backward(const MegatronDataset& ds, int64_t first);
  // --enable-cuda-graph: forward_backward on static inputs; eager warm-up, capture, then replays.
  StepLoss forward_backward_graphed(const MegatronDataset& ds, int64_t first);
  double train_step(double* grad_norm, bool* skipped);
  // --calculate-per-token-loss: divides the (DP-averaged) token-sum gradients by the global number of
  // non-masked tokens (all microbatches, all DP ranks); returns the global per-token loss.
  double scale_grads_per_token(const StepLoss& local);
  void save(int64_t iteration);
  // --async-save: vote + commit a finished background save (blocking: wait for it); logs, retention.
  void finalize_async_save(bool blocking);
  void after_commit(const std::string& dir, int64_t iteration);  // --keep-last-n-checkpoints (rank 0)
  std::vector<ModelChunk*> chunk_ptrs() const;
  // One ModelChunk per virtual stage of this pipeline rank with its DistributedDataParallel (and its MoE experts' over
  // expert-DP): the trainer's model (the constructor), or --rerun-on-cpu's fp32 CPU copy of it.
  struct ModelReplica {
    std::vector<std::unique_ptr<ModelChunk>> chunks;
    std::vector<std::unique_ptr<DistributedDataParallel>> ddps, expert_ddps;
  };
  ModelReplica build_model(const TransformerConfig& model, Device device, DType dtype,
                           const parallel_state::ParallelContext& pc, bool distributed_optimizer) const;
  bool is_logging_rank() const { return pc_.rank() == pc_.world_size() - 1; }
  // Bytes this rank allocated for params, main grads, fp32 main params and optimizer state (the report's
  // measured model state, beside the memory plan's).
  int64_t model_state_bytes() const;
  double dp_mean(double local) const;
  // MoE: the window's router losses averaged over every rank's layer calls into st (collective over the world).
  void moe_log_losses(IterationStats& st);
  void mtp_log_losses(IterationStats& st);  // collective over the world
  // MoE: the window's expert load (routes per expert, dropped routes, router entropy) over every rank's tokens, per
  // iteration of the window's `iters` (collective over the world).
  void moe_log_load(IterationStats& st, int64_t iters);
  // What train() accumulated since the last log line (Megatron's log interval).
  struct LogWindow {
    std::chrono::steady_clock::time_point start{};
    int64_t samples_at_start = 0;  // tokens/s: a ramp-up's batches differ
    double loss_sum = 0;
    int64_t iters = 0;
    double grad_norm_last = 0;
    int64_t skipped_total = 0, nan_total = 0;  // since train() began (not reset per window)
    RankWindow rank{};  // this rank's step times and timers (rank_metrics.h)
  };
  LogWindow window_;
  // The log line and its metrics record for the window ending at `iteration` (collective: the MoE / MTP losses);
  // then a new window starts.
  void log_window(int64_t iteration, double lr, int64_t batch, double last_loss);
  // Per-stage activation memory (collective), the --timeline trace + bubble report (collective), peak device memory.
  void report_end_of_training();
  // Observability (docs/OBSERVABILITY.md): the metrics writers and TensorBoard, opened first thing in the constructor
  // (an unwritable path is one error before any work); Megatron's timers; the MFU's peak.
  void open_outputs();
  // The window's per-rank part (collective over the world): this rank's timers, memory and metrics record, the
  // gather of every rank's step and phase times; on the last rank the log line (st + min / max over ranks), the
  // metrics record, Megatron's timer report (--timing-log-level), the straggler report (--log-straggler) and the
  // window's TensorBoard scalars.
  void report_window(IterationStats& st, double last_loss, int64_t tokens);
  // --trace-modules: the last rank prints the step's module trees (core/module_trace.h); every rank writes them to its
  // metrics ({"event": "module_trace"}).
  void report_module_trace(int64_t iteration, const ModuleTraceRecording::Trees& trees);
  // Megatron's per-iteration TensorBoard scalars (every tensorboard_log_interval; last rank).
  void tensorboard_iteration(int64_t iteration, double lr, int64_t batch, double loss, double grad_norm);
  MetricsWriter rank_metrics_;              // <metrics stem>.rank_<r>.jsonl (every rank; --no-per-rank-metrics: none)
  tensorboard::SummaryWriter tensorboard_;  // --tensorboard-dir (last rank)
  std::unique_ptr<Timers> timers_;          // --timing-log-level
  double peak_tflops_ = 0;                  // MFU's peak per GPU (0: unknown, no MFU)
  std::vector<pipeline_parallel::ActionTiming> step_actions_;  // level-2 timers' schedule timings (no --timeline)

  Config config_;
  parallel_state::ParallelContext pc_;
  moe::LossTracker moe_losses_;  // this rank's MoE router losses per layer since the last log line
                                 // (the MTP depths' MoE layers after the decoder's: num_layers + k)
  MtpLossTracker mtp_losses_;    // this rank's MTP losses per depth since the last log line
  Device device_ = Device::CPU;         // --device (resolved): where params, grads and activations live
  DType param_dtype_ = DType::F32;      // bf16 with --bf16 (fp32 main params and grads)
  int64_t eod_token_ = -1;  // the tokenizer's EOD (--reset-position-ids / --reset-attention-mask documents)
  std::unique_ptr<MegatronDataset> train_ds_;
  std::unique_ptr<MegatronDataset> valid_ds_;
  std::unique_ptr<MegatronDataset> test_ds_;  // the test split, evaluated once at the end of training
  std::vector<std::unique_ptr<ModelChunk>> chunks_;  // by virtual pipeline stage
  std::vector<std::unique_ptr<DistributedDataParallel>> ddps_;  // one per chunk (its own buffers)
  // One per chunk: its MoE experts' buffer (over expert-DP at EP > 1); null where the chunk has no experts.
  std::vector<std::unique_ptr<DistributedDataParallel>> expert_ddps_;
  std::vector<ParamAndGradBuffer*> buffers() const;         // every chunk's, dense and expert
  std::vector<ParamAndGradBuffer*> dense_buffers() const;   // the chunks' params()
  std::vector<ParamAndGradBuffer*> expert_buffers() const;  // the chunks' expert_params() (MoE)
  std::vector<DistributedDataParallel*> all_ddps() const;   // ddps_, then the expert ones
  std::unique_ptr<Adam> optimizer_;                    // without --use-distributed-optimizer
  std::unique_ptr<DistributedOptimizer> dist_optimizer_;  // with it
  OptimizerRef optimizer_ref() const { return {optimizer_.get(), dist_optimizer_.get()}; }
  std::unique_ptr<OptimizerParamScheduler> scheduler_;
  TrainerState state_;
  MetricsWriter metrics_;
  std::unique_ptr<timeline::TimelineRecorder> timeline_;  // --timeline: training-step action intervals
  std::unique_ptr<dist_checkpointing::AsyncCheckpointSaver> async_saver_;  // --async-save
  dist_checkpointing::SaveDirLock save_lock_;  // rank 0 with --save: the save directory is this job's
  timeline::StageMemory stage_memory_;  // activation memory maxima over the training steps (the end's report)
  // tools/memory_planner's plan of this run (every layout; MoE under EP assumes balanced routing): printed at the
  // start, its planned activation figures beside the measured ones in the end's report.
  std::optional<tools::MemoryPlan> memory_plan_;
  // --enable-cuda-graph: the captured step, its static inputs (one Batch per microbatch, on the device)
  // and loss statistics [M, 2], and the eager steps still to run before capturing.
  std::unique_ptr<CudaGraph> step_graph_;
  std::vector<Batch> graph_inputs_;
  Tensor graph_loss_stats_;
  int64_t graph_warmup_left_ = 0;
  // Dropout under graphs: the device slots the captured keys add to their offsets ([2] uint64: the default
  // and model-parallel streams' offsets at the start of the step being replayed), and what one step draws.
  Tensor graph_rng_base_;
  std::array<uint64_t, 2> graph_rng_step_{};
  void write_graph_rng_base();  // state_.rng's current offsets -> graph_rng_base_

  // ---- diagnosis (trainer_diagnosis.cpp; training/nan_localizer.h, training/fault_injection.h)
  double global_grad_norm();  // the step's grad norm over every rank (collective)
  enum class RerunTrigger { NanGradNorm, SpikyLoss };
  // After the grad norm, the same on every rank: whether the step must be re-run (--check-for-nan-in-loss-and-grad:
  // a non-finite grad norm; --check-for-spiky-loss: the world's largest loss spikes; a collective then).
  std::optional<RerunTrigger> rerun_trigger(double grad_norm, double local_loss);
  // Re-runs the step from rng_before with a NanProbe (collective), classifies, reports (log, metrics, incident file).
  void diagnose_step(RerunTrigger trigger, const tensor_parallel::RngTracker& rng_before, double grad_norm,
                     double local_loss);
  double world_max_loss(double local_loss);  // collective over the world: NaN when any rank's is non-finite
  std::unique_ptr<FaultInjector> faults_;  // --inject-fault (null: none)
  NanProbe* nan_probe_ = nullptr;          // during a re-run: told the schedule's microbatch
  std::vector<double> healthy_losses_;     // --check-for-spiky-loss: the last kSpikyLossWindow healthy losses
  double step_loss_max_ = 0;               // --check-for-spiky-loss: this step's largest loss over the world
  int64_t step_iteration_ = 0;             // the step being run (1-based, as logged)
  std::string metrics_path_;               // the metrics JSONL (empty: none); incident files beside it
  // --check-data-consistency: while a due step builds its batches, their digests (null: not due)
  std::vector<MicrobatchDigest>* data_digests_ = nullptr;

  // ---- --rerun-on-cpu (trainer_cpu_rerun.cpp)
  // This rank's microbatches of the step as the model got them (after --inject-fault bad-batch and the CP split):
  // recorded by every training step while record_batches_ (handles of the host tensors get_batch built: no copy),
  // replayed by the CPU re-run (replay_batches_ set: run_microbatches takes its batches from there).
  std::vector<Batch> step_batches_;
  bool record_batches_ = false;
  const std::vector<Batch>* replay_batches_ = nullptr;
  // The latest committed checkpoint (the loaded one until this run saves): its directory and the iteration whose end
  // state it holds (-1: none).
  std::string last_checkpoint_dir_;
  int64_t last_checkpoint_iteration_ = -1;
  // The fp32 CPU copy of this rank's model, built at the first CPU re-run and kept; swap_cpu_replica() exchanges it
  // with the trainer's model members (a second call swaps back).
  struct CpuReplica {
    parallel_state::ParallelContext pc;  // pc_, or the same layout over the world's host communicator (NCCL runs)
    ModelReplica model;
    Device device = Device::CPU;
    DType dtype = DType::F32;
    std::unique_ptr<timeline::TimelineRecorder> timeline;  // none: the re-run stays out of the trace,
    timeline::StageMemory stage_memory{};                   // the activation report,
    moe::LossTracker moe_losses;                            // and the logged router and MTP losses
    MtpLossTracker mtp_losses;
  };
  std::unique_ptr<CpuReplica> cpu_replica_;
  void swap_cpu_replica();
  // Startup: the replica's planned host memory (fp32 params + grads + activations; beside the model's own on a CPU
  // run) must fit this rank's share of the host memory (local_ranks on this host; mcpp::Error otherwise).
  void require_cpu_replica_fits(int local_ranks) const;
  // The step again in fp32 on CPU (collective over the world): from the checkpoint of iteration step_iteration_ - 1 if
  // that is the latest committed one, else from the pre-step state; the recorded batches, the dropout streams at
  // rng_before, a NanProbe; no injected fault. `trigger`: what reproduces means (non-finite, or a spike).
  CpuRerun rerun_on_cpu(RerunTrigger trigger, const tensor_parallel::RngTracker& rng_before);
  // Fills the replica's weights (collective: the ranks agree on the source) and r's state / checkpoint / why_state.
  void load_cpu_replica(CpuRerun& r);
  void copy_pre_step_state();  // the trainer's fp32 masters (gathered over DP when the optimizer shards them)
};

}  // namespace mcpp
