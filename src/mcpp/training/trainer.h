// The single-process pretraining loop (Megatron-LM's training.py: pretrain / train / train_step /
// evaluate), on the GPTModel with contiguous main grads, Adam, Megatron's LR schedule and global clip.
//   iteration: zero main grads -> for each of num_microbatches: next micro batch from the train cursor,
//   forward (dropout on) + backward with grad scale 1/num_microbatches -> grad norm + clip -> Adam step
//   at the scheduled LR (skipped, and counted, when the grad norm is not finite) -> scheduler step.
// Logs a Megatron log line every log_interval, evaluates on the valid split every eval_interval, saves
// every save_interval and at the end. Deterministic given --seed: a run resumed from iteration k
// reproduces the uninterrupted run's losses bit for bit on CPU.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "mcpp/datasets/gpt_dataset.h"
#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/training/checkpointing.h"
#include "mcpp/training/metrics.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp {

class Adam;
class OptimizerParamScheduler;

struct TrainSummary {
  int64_t iterations_run = 0;
  int64_t final_iteration = 0;
  std::vector<double> losses;     // lm loss of each iteration run (for tests / tools)
  double last_valid_loss = -1;    // -1 when no evaluation ran
};

class Trainer {
 public:
  // config: finalized, validated for training, apply_world_size(1) done, vocab set from the tokenizer.
  // eod_token: the tokenizer's EOD id (for --eod-mask-loss).
  Trainer(const Config& config, int64_t eod_token);
  ~Trainer();
  TrainSummary train();
  double evaluate(int64_t iteration);  // mean lm loss over eval_iters global batches of the valid split

 private:
  struct Batch {
    Tensor tokens, labels, loss_mask;  // [s, b]
  };
  Batch next_batch(GPTSampleCursor& cursor);
  double train_step(double* grad_norm, bool* skipped);
  void save(int64_t iteration);

  Config config_;
  std::unique_ptr<GPTDataset> train_ds_;
  std::unique_ptr<GPTDataset> valid_ds_;
  std::unique_ptr<GPTModel> model_;
  std::unique_ptr<Adam> optimizer_;
  std::unique_ptr<OptimizerParamScheduler> scheduler_;
  std::unique_ptr<GPTSampleCursor> train_cursor_;
  TrainerState state_;
  MetricsWriter metrics_;
};

}  // namespace mcpp
