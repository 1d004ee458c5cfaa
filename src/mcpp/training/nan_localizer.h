// NaN / Inf and loss-spike localisation (Megatron's --check-for-nan-in-loss-and-grad, --check-for-spiky-loss and its
// rerun state machine; issue 33). The trainer (trainer_diagnosis.cpp) decides after the grad norm, before the
// optimizer step: a non-finite global grad norm (a NaN / Inf loss reaches the grads, so the norm covers the loss), or a
// loss above spiky_loss_factor x the largest of the last kSpikyLossWindow healthy losses. Then it re-runs the step on
// the same ranks from the pre-step state (the parameters and optimizer are untouched before the optimizer step; the
// RNG offsets are restored; the batch is the same: consumed samples have not moved) with a NanProbe installed:
// every module scope's output (forward) and returned gradient (backward) is checked with ops::has_non_finite, and
// the first non-finite one is kept with its microbatch. Healthy steps run no check (no probe installed).
// Classification (Megatron's rerun state machine, the same-rank re-run): the re-run fails again -> reproducible;
// it is healthy -> transient. Either way the step is skipped (no optimizer step) and training goes on.
// gather_findings is a collective over the world (every rank calls it with its probe's finding): the ranks that saw
// a non-finite tensor, and the culprit, the earliest finding in causal order (microbatch; forward before backward;
// forward by ascending pipeline stage, backward descending; then the module's position in the pass).
// --rerun-on-cpu (trainer_cpu_rerun.cpp) adds a third run: the same step in fp32 on CPU, with the same probe; its
// verdict (CpuRerun) joins the incident: non-finite there -> a numerics problem (reproducible in fp32 on CPU: the
// learning rate, the data); finite -> a device or precision fault (the numerics are sound in fp32).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/core/module_trace.h"

namespace mcpp {
namespace comm { class Communicator; }

inline constexpr size_t kSpikyLossWindow = 100;  // healthy losses the spike test compares against

struct NonFiniteFinding {
  std::string module;   // qualified: "decoder.layers.2.mlp"
  bool backward = false;  // false: the module's forward output; true: the gradient its backward returned
  int64_t layer = -1;   // decoder.layers.K -> K (-1: not inside a decoder layer)
  int64_t microbatch = -1;
  int64_t position = 0;  // the module call's position in this rank's re-run
  int pp_stage = 0;
  int rank = 0;
  std::string tensor() const { return backward ? "gradient" : "forward output"; }
};

// Installed while alive (a ScopeObserver): the first non-finite module output / gradient of this rank.
class NanProbe : public ScopeObserver {
 public:
  NanProbe(int rank, int pp_stage);
  ~NanProbe() override;
  NanProbe(const NanProbe&) = delete;
  NanProbe& operator=(const NanProbe&) = delete;
  void set_microbatch(int64_t m) { microbatch_ = m; }  // the schedule's current action
  void on_output(const std::vector<const char*>& scopes, bool backward, const Tensor& t) override;
  const std::optional<NonFiniteFinding>& finding() const { return finding_; }

 private:
  int rank_, pp_stage_;
  int64_t microbatch_ = -1, position_ = 0;
  std::optional<NonFiniteFinding> finding_;
};

struct Findings {
  std::vector<NonFiniteFinding> all;        // one per rank that found one, rank order
  std::optional<NonFiniteFinding> culprit;  // the earliest (none: the re-run was finite everywhere)
};
// Collective over `world`.
Findings gather_findings(comm::Communicator& world, const std::optional<NonFiniteFinding>& mine);

// --rerun-on-cpu's run of the step: fp32 on CPU, this rank's slice of the model in the same parallel layout.
struct CpuRerun {
  std::string state;       // where the weights came from: "checkpoint" | "pre-step state"
  std::string checkpoint;  // state "checkpoint": its directory
  std::string why_state;   // state "pre-step state": why not a checkpoint (none saved, an older one, a failed load)
  double loss = 0, grad_norm = 0, ms = 0;
  Findings findings;       // the probe's, gathered over the world
  bool non_finite = false;  // a module's output / gradient, the loss or the grad norm
  bool reproduces = false;  // fails as the device did: non-finite (nan_grad_norm) or non-finite / spiky (spiky_loss)
  std::string verdict() const;         // "finite" | "non-finite at decoder.layers.1.mlp gradient" | ...
  std::string classification() const;  // numerics problem vs device or precision fault
};

// One incident: what triggered the re-run and what it found.
struct NanIncident {
  int64_t iteration = 0;
  std::string trigger;          // "nan_grad_norm" | "spiky_loss"
  double grad_norm = 0, loss = 0, rerun_grad_norm = 0, rerun_loss = 0;
  double spike_reference = 0;   // spiky_loss: the largest recent healthy loss
  bool reproducible = false;    // the same-rank re-run failed again
  Findings findings;
  std::optional<CpuRerun> cpu;  // --rerun-on-cpu
};
nlohmann::json to_json(const NanIncident& i);
std::string describe(const NanIncident& i);  // the log line(s), Megatron's rerun wording
// Whether `loss` spikes: > factor * max(history) (history: recent healthy losses; empty: never).
bool is_spiky_loss(double loss, const std::vector<double>& history, double factor);

}  // namespace mcpp
