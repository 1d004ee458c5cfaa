// Megatron's training timers by id, on the host clock or CUDA compute-stream marks (timers.h).
#include "mcpp/training/timers.h"

#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/device_clock.h"

namespace mcpp {
namespace {

struct TimerInfo {
  std::string_view name;
  int level;
};
// In TimerId order; the names and levels of Megatron's training.py timers_to_log.
constexpr std::array<TimerInfo, kNumTimers> kTimers{{
    {"forward-backward", 1},
    {"all-grads-sync", 1},
    {"layernorm-grads-all-reduce", 1},
    {"embedding-grads-all-reduce", 1},
    {"params-all-gather", 1},
    {"optimizer-clip-main-grad", 1},
    {"optimizer-inner-step", 1},
    {"optimizer", 1},
    {"batch-generator", 2},
    {"forward-compute", 2},
    {"backward-compute", 2},
    {"forward-recv", 2},
    {"forward-send", 2},
    {"backward-recv", 2},
    {"backward-send", 2},
    {"forward-send-forward-recv", 2},
    {"forward-send-backward-recv", 2},
    {"backward-send-forward-recv", 2},
    {"backward-send-backward-recv", 2},
    {"forward-backward-send-forward-backward-recv", 2},
}};

double ms_since(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace

std::string_view timer_name(TimerId id) { return kTimers[static_cast<size_t>(id)].name; }
int timer_level(TimerId id) { return kTimers[static_cast<size_t>(id)].level; }

TimerId timer_of(const pipeline_parallel::Action& a) {
  using pipeline_parallel::ActionKind;
  if (a.kind == ActionKind::Forward) return TimerId::ForwardCompute;
  if (a.kind == ActionKind::Backward) return TimerId::BackwardCompute;
  const bool sf = a.send_next.has_value(), sb = a.send_prev.has_value();
  const bool rf = a.recv_prev.has_value(), rb = a.recv_next.has_value();
  const int sends = sf + sb, recvs = rf + rb;
  if (sends + recvs == 1) {
    if (sf) return TimerId::ForwardSend;
    if (sb) return TimerId::BackwardSend;
    return rf ? TimerId::ForwardRecv : TimerId::BackwardRecv;
  }
  if (sends == 1 && recvs == 1) {
    if (sf) return rb ? TimerId::ForwardSendBackwardRecv : TimerId::ForwardSendForwardRecv;
    return rf ? TimerId::BackwardSendForwardRecv : TimerId::BackwardSendBackwardRecv;
  }
  return TimerId::ForwardBackwardSendForwardBackwardRecv;  // Megatron's combined call (and its partial forms)
}

Timers::Timers(int log_level, bool device) : level_(log_level) {
  if (device && log_level > 0) clock_ = std::make_unique<DeviceClock>();
}

Timers::~Timers() = default;

Timers::Scope::Scope(Timers* t, TimerId id) {
  if (!t->on(id)) return;
  if (t->clock_) {
    if (stream_capturing()) return;  // a captured step has no time; the replay is timed around it
    mark_ = t->clock_->mark();
  } else {
    t0_ = std::chrono::steady_clock::now();
  }
  t_ = t;
  id_ = id;
}

Timers::Scope::~Scope() {
  if (!t_) return;
  if (t_->clock_) {
    t_->pending_.push_back({id_, mark_, t_->clock_->mark()});
  } else {
    t_->ms_[static_cast<size_t>(id_)] += ms_since(t0_, std::chrono::steady_clock::now());
  }
}

void Timers::add_ms(TimerId id, double ms) {
  if (on(id)) ms_[static_cast<size_t>(id)] += ms;
}

void Timers::add_actions(const std::vector<pipeline_parallel::ActionTiming>& actions, size_t from,
                         DeviceClock* clock) {
  for (size_t i = from; i < actions.size(); ++i) {
    const pipeline_parallel::ActionTiming& a = actions[i];
    const TimerId id = timer_of(a.action);
    if (!on(id)) continue;
    if (a.device_start < 0 || !clock) {
      ms_[static_cast<size_t>(id)] += ms_since(a.start, a.end);
    } else if (clock == clock_.get()) {
      pending_.push_back({id, a.device_start, a.device_end});
    } else {
      ms_[static_cast<size_t>(id)] += clock->micros_between(a.device_start, a.device_end) / 1000.0;
    }
  }
}

std::array<double, kNumTimers> Timers::take() {
  if (clock_ && !pending_.empty()) {
    for (const Pending& p : pending_)
      ms_[static_cast<size_t>(p.id)] += clock_->micros_between(p.from, p.to) / 1000.0;
    clock_->retire_before(clock_->size());
    pending_.clear();
  }
  std::array<double, kNumTimers> out = ms_;
  ms_.fill(0.0);
  return out;
}

}  // namespace mcpp
