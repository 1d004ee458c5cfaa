// Per-rank step metrics of a log interval, their gather over the world, Megatron's timer report and the straggler
// report (training/trainer_reports.cpp calls them at every log line).
//
// Every rank keeps, per log window: its host step times (train_step's wall time, each iteration), its timers'
// totals (timers.h) and, at the log line, its memory (memory_now()). rank_record() is the rank's JSONL record
// (<metrics stem>.rank_<r>.jsonl, written by every rank unless --no-per-rank-metrics):
//   {"event": "train", "iteration": it, "rank": r, "iterations": n, "step_ms": [n host step times],
//    "step_ms_mean": m, "timers_ms": {"forward-backward": per-iteration ms, ...} (the timers measured on this rank),
//    "memory": {"kind": "device" | "host", "allocated_bytes", "reserved_bytes", "peak_bytes"}, "tokens": the
//    window's tokens of the global batches, "pp_rank", "tp_rank", "dp_rank", ...}
// memory: on a GPU the CUDA pool (allocated / reserved now, the peak since start); on CPU ranks the process's
// resident set (VmRSS as allocated and reserved, VmHWM as peak: the host has no pool).
// gather_ranks (collective over world, one all-gather of world x (2 + kNumTimers) floats): every rank's mean and
// max step time and per-iteration timer means; RanksSummary holds them for the last rank's reports:
//   format_timers: Megatron's timers.log text for --timing-log-option — "max time across ranks (ms):" (max),
//     "(min, max) time across ranks (ms):" (minmax; ranks without the timer left out, as Megatron filters <= 0) or
//     "times across ranks (ms):" (all, every rank), one line per timer "    forward-backward ......: (a, b)";
//   straggler_json / format_straggler (--log-straggler): the slowest and fastest rank by mean step time, their
//     step and phase times ("phases_ms": [[name, ms], ...] of forward-backward, forward-compute, backward-compute,
//     all-grads-sync, optimizer, params-all-gather, where measured) and max / min ratio, and the ranks whose step
//     time exceeds the median by more than --straggler-threshold percent (named: "straggler: rank 3 ..").
//     Megatron's straggler detector reports the same min / max of per-rank times (its --log-straggler).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/comm/communicator.h"
#include "mcpp/core/dtype.h"
#include "mcpp/training/timers.h"

namespace mcpp {

struct MemoryNow {
  std::string kind;  // "device" | "host"
  int64_t allocated_bytes = 0, reserved_bytes = 0, peak_bytes = 0;
};
MemoryNow memory_now(Device device);
nlohmann::json to_json(const MemoryNow& m);

struct RankWindow {
  std::vector<double> step_ms;                // host wall time of each training step of the window
  std::array<double, kNumTimers> timers_ms{};  // totals over the window (Timers::take), 0: not measured
  double step_ms_mean() const;
  double step_ms_max() const;
};

nlohmann::json rank_record(int64_t iteration, int rank, const RankWindow& w, const MemoryNow& mem, int64_t tokens);

struct RanksSummary {
  // per rank: mean step ms, max step ms, then per timer the per-iteration mean (0: not measured)
  std::vector<std::array<double, 2 + kNumTimers>> rows;
  int slowest() const;   // the rank of the largest mean step time
  int fastest() const;   // the rank of the smallest
  double step_min() const;
  double step_max() const;
  double step_median() const;
};
RanksSummary gather_ranks(comm::Communicator& world, const RankWindow& mine);

// Megatron's timer report (option "max" | "minmax" | "all") of the timers on at `level`; "" when none measured.
std::string format_timers(const RanksSummary& s, const std::string& option, int level);
nlohmann::json straggler_json(const RanksSummary& s, double threshold_percent);
std::string format_straggler(const nlohmann::json& report);

}  // namespace mcpp
