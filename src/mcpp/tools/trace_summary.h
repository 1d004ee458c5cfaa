// Pipeline trace analysis — reads the Chrome/Perfetto trace `mcpp train --timeline` writes
// (training/timeline.h) and measures, per rank (pid):
//   forward / backward / p2p   length of the UNION of that category's intervals (overlaps count once)
//   span                       sum over training steps of the step's window [min start, max end] taken
//                              over ALL ranks (events without args.step form one window)
//   busy                       |union(forward ∪ backward)|;  bubble = 1 - busy / span
//   idle                       span - |union(all intervals of the rank)|
//   overlap                    |union(compute) ∩ union(p2p)| — computed by sort + sweep, never by summing
//   collective / coll_overlap  |union(collective)| and |union(compute) ∩ union(collective)| (the
//                              timeline's tid-2 row: TP / DDP / optimizer collectives on the comm stream);
//                              collectives are not part of span, idle or bubble (those stay the schedule's);
//                              per call name too (CallStats; the table prints them per step). A compute row
//                              is a whole forward / backward action, so a collective the compute stream
//                              waits for inside it (TP) counts as overlapped: coll_overlap is an upper bound
//                              there, exact for calls between actions (DDP buckets, optimizer, P2P).
// and the slowest stage (the most busy time). "layer" events (the timeline's per-module rows, tid 3: a decoder layer,
// the embedding, the output layer / loss inside a compute action, args.pass "forward"|"backward") are parsed for
// tools/layout_planner.h and left out of the summary (they nest inside the compute rows). Theoretical bubble (pp-1)/(V*M+pp-1) when the trace's
// otherData carries pipeline_model_parallel_size / num_microbatches / virtual_pipeline_model_parallel_size.
//
// Trace format read: {"traceEvents": [{"ph": "X", "pid": int, "tid": int, "name": str,
//   "cat": "forward"|"backward"|"p2p"|"collective"|"layer", "ts": us, "dur": us, "args": {"step", "stage", ...}}, ...],
//   "otherData": {...}}. "M" (metadata) events are skipped. A missing file, bad JSON, or an X event
// without pid / ts / dur / a known cat is an mcpp::Error naming the file and the event index.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mcpp::tools {

struct Span {
  double start = 0, end = 0;
  bool operator==(const Span&) const = default;
};

// Sorted, disjoint, merged (touching spans merge); empty spans dropped.
std::vector<Span> interval_union(std::vector<Span> spans);
double total_length(const std::vector<Span>& merged);
// |a ∩ b| for two merged lists (two-pointer sweep).
double intersection_length(const std::vector<Span>& a, const std::vector<Span>& b);

// Megatron's bubble: (pp - 1) / (V * M + pp - 1).
double theoretical_bubble(int64_t pp, int64_t num_microbatches, int64_t vpp);

enum class EventCat { Forward, Backward, P2P, Collective, Layer };

struct TraceEvent {
  int64_t pid = 0;
  EventCat cat = EventCat::Forward;
  std::string name;
  double ts = 0, dur = 0;  // microseconds
  int64_t step = -1;       // args.step (-1 if absent)
  int64_t stage = -1;      // args.stage (-1 if absent -> the summary uses pid)
  bool backward_pass = false;  // Layer events: args.pass == "backward"
};

struct Trace {
  std::vector<TraceEvent> events;
  nlohmann::json other_data = nlohmann::json::object();
};

Trace parse_trace(const nlohmann::json& j, const std::string& source);  // source names the file in errors
Trace read_trace(const std::string& path);

// One collective call name of a rank ("all_reduce dp_cp", "batch_p2p pp", ...): how many, the union of
// their intervals and its overlap with the rank's compute rows (totals over the summarized steps).
struct CallStats {
  std::string name;
  int64_t count = 0;
  double us = 0, overlap_us = 0;
};

struct RankStats {
  int64_t pid = 0, stage = 0;
  double forward_us = 0, backward_us = 0, p2p_us = 0, idle_us = 0, busy_us = 0, span_us = 0, overlap_us = 0;
  double collective_us = 0, collective_overlap_us = 0;
  double bubble = 0;
  std::vector<CallStats> calls;  // by name
};

struct TraceSummary {
  std::vector<RankStats> ranks;  // by pid
  int64_t slowest_pid = -1;
  double theoretical = -1;  // -1: unknown
  std::string clock = "host";  // otherData's "clock": "device" when the intervals are GPU time (timeline.h)
  int64_t steps = 0, skipped_steps = 0;  // steps summarized / left out (warm-up)
};

// skip_steps: the events of the first skip_steps steps (in step order) are left out — the warm-up steps,
// where plans are built, GEMMs autotuned and P2P connections set up. Skipping every step of the trace is
// an mcpp::Error naming both counts.
TraceSummary summarize(const Trace& trace, int64_t skip_steps = 0);
std::string format_summary(const TraceSummary& s);

}  // namespace mcpp::tools
