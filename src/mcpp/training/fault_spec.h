// --inject-fault KIND[:OPTS]@ITER[:RANK] values parsed into FaultSpec (the kinds and their meaning:
// fault_injection.h), and checked against the run they are aimed at. Plain values only — no communicator, no
// tensors — so TrainingConfig::validate() refuses a malformed value, and the Trainer's setup (once the world size
// and the iteration count are known) a drill that could never fire, before anything trains.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mcpp {

enum class FaultKind { NanGrad, NanOutput, Kill, Hang, SlowData, SlowRank, WrongCollective, BadShard, BadBatch, CorruptCollective };
const char* fault_kind_name(FaultKind k);

struct FaultSpec {
  FaultKind kind = FaultKind::Kill;
  int64_t iteration = 0;
  int rank = 0;
  int64_t layer = -1;       // the NaN kinds
  bool persistent = false;  // the NaN kinds: also in the re-run of the step
  int64_t ms = 1000;        // slow-data / slow-rank
  bool every = false;       // slow-data / slow-rank: every iteration from ITER on (a steady slowdown)
  bool extra = false;       // wrong-collective: a call only this rank issues (default: a shape mismatch)
  std::string text;         // as given
};
// One --inject-fault value; a malformed one is an mcpp::Error naming it and the grammar.
FaultSpec parse_fault_spec(const std::string& text);

// What a run offers a drill.
struct FaultRun {
  int world_size = 1;
  int64_t num_layers = 0;      // decoder layers (layer=K names decoder.layers.K)
  int64_t train_iters = 0;     // the run's last iteration (derived when sample-based)
  bool skip_train = false;     // --skip-train: no training step
  bool saves = false;          // --save given
  int64_t save_interval = 0;   // --save-interval (0: only the final save)
  int64_t exit_interval = 0;   // --exit-interval (a job may end, and save, at a multiple)
  std::function<std::vector<int64_t>(int rank)> layers_held;  // the decoder layers of a global rank's pipeline stage
};
// A drill that cannot fire in `run` is an mcpp::Error naming the spec and why: a RANK outside the world, an ITER
// beyond the last iteration (or any ITER with --skip-train), a layer K outside the model or not held by RANK's
// pipeline stage, bad-shard without --save or at an iteration that saves no checkpoint, hang / wrong-collective /
// corrupt-collective in a world of one rank (no peer to wait for, mismatch or compare with).
void check_fault_fits_run(const FaultSpec& f, const FaultRun& run);

}  // namespace mcpp
