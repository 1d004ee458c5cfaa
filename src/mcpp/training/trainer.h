// The pretraining loop (Megatron-LM's training.py: pretrain / train / train_step / evaluate) on one
// rank of a ParallelContext (tensor + data parallel; a single process is the size-1 context).
//   iteration: zero main grads -> for each local microbatch m: rows [dp_rank*mbs, +mbs) of the m-th
//   mbs*dp slice of the global batch, forward (dropout on) + backward with grad scale 1/num_microbatches
//   -> DP gradient reduction (DistributedDataParallel: average over DP per bucket, overlapped with the last
//   microbatch's backward with --overlap-grad-reduce; reduce-scatter with --use-distributed-optimizer)
//   -> finalize_model_grads (SP norm grads over TP) -> grad norm (each param once) + clip -> Adam step at
//   the scheduled LR (sharded + param all-gather with the distributed optimizer; skipped, and counted,
//   when the norm is not finite) -> scheduler step.
// The last rank prints Megatron's log line every log_interval and writes the JSONL metrics; evaluation
// on the valid split every eval_interval; checkpoints every save_interval and at the end (collective:
// logical tensors gathered over TP, written by rank 0). Deterministic given --seed: a run resumed from
// iteration k reproduces the uninterrupted run's losses bit for bit on CPU.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "mcpp/datasets/gpt_dataset.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/parallel_state/parallel_context.h"
#include "mcpp/training/checkpointing.h"
#include "mcpp/training/metrics.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

class Adam;
class OptimizerParamScheduler;
class DistributedDataParallel;
class DistributedOptimizer;

struct TrainSummary {
  int64_t iterations_run = 0;
  int64_t final_iteration = 0;
  std::vector<double> losses;     // lm loss of each iteration run (mean over DP), for tests / tools
  double last_valid_loss = -1;    // -1 when no evaluation ran
};

class Trainer {
 public:
  // config: finalized, validated for training, apply_world_size(world) done, vocab set from the tokenizer.
  // eod_token: the tokenizer's EOD id (for --eod-mask-loss). pc: this rank's parallel context.
  Trainer(const Config& config, int64_t eod_token, parallel_state::ParallelContext pc);
  ~Trainer();
  TrainSummary train();
  double evaluate(int64_t iteration);  // mean lm loss over eval_iters global batches of the valid split
  GPTModel& model() { return *model_; }

 private:
  struct Batch {
    Tensor tokens, labels, loss_mask;  // [s, b]
  };
  // Micro batch `m` of the global batch starting at sample `first` (this DP rank's rows).
  Batch get_batch(const GPTDataset& ds, int64_t first, int64_t m) const;
  double train_step(double* grad_norm, bool* skipped);
  void save(int64_t iteration);
  bool is_logging_rank() const { return pc_.rank() == pc_.world_size() - 1; }
  double dp_mean(double local) const;

  Config config_;
  parallel_state::ParallelContext pc_;
  std::unique_ptr<GPTDataset> train_ds_;
  std::unique_ptr<GPTDataset> valid_ds_;
  std::unique_ptr<GPTModel> model_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<Adam> optimizer_;                    // without --use-distributed-optimizer
  std::unique_ptr<DistributedOptimizer> dist_optimizer_;  // with it
  OptimizerRef optimizer_ref() const { return {optimizer_.get(), dist_optimizer_.get()}; }
  std::unique_ptr<OptimizerParamScheduler> scheduler_;
  TrainerState state_;
  MetricsWriter metrics_;
};

}  // namespace mcpp
