// Pipeline timeline (`mcpp train --timeline PATH`): every rank records its schedule actions' intervals
// for the training steps (not evaluation) and, at the end of training, all ranks' intervals are gathered
// over the world communicator and written as one Chrome/Perfetto trace:
//   {"traceEvents": [
//      {"ph":"M","name":"process_name","pid":r,"args":{"name":"rank r (pp stage s)"}},
//      {"ph":"M","name":"thread_name","pid":r,"tid":0|1,"args":{"name":"compute"|"p2p"}},
//      {"ph":"X","pid":rank,"tid":0 (compute) | 1 (p2p),"name":"F3.1" | "B3.1" | <Megatron P2P name>,
//       "cat":"forward"|"backward"|"p2p","ts":us,"dur":us,
//       "args":{"step":i,"stage":pp_rank,"microbatch":m,"chunk":c} (p2p: "ops": "send_forward(sn=3.0)")}, ...],
//    "otherData": {"pipeline_model_parallel_size", "num_microbatches", "virtual_pipeline_model_parallel_size",
//                  "clock": "host" | "device"}}
// ts is microseconds since a common origin taken right after a world barrier (start()), so ranks align
// to within the barrier's exit skew. A P2P interval is the whole batch_p2p call including waiting for the
// peer (not separable on CPU ranks); tools/trace_summary.h calls it comm.
// Clock: on CPU ranks the host's steady clock (the work runs in the calls). On the CUDA backend the host
// only enqueues, so the recorder keeps a DeviceClock (core/device_clock.h): the origin is a compute-stream
// mark made right after the barrier on a drained device, and every interval is the device time between the
// runner's marks around the action (schedule_runner.h) — what the GPU did, and how long it waited in P2P.
// A long run stays exact and small: each step's times are read at the step after next's begin_step (its
// marks long completed, so no wait) and its marks retired (DeviceClock::retire_before: a few steps' events
// alive, not two per action of the whole run); ts is the step's anchor (its first mark) plus the offset
// from it, the anchors chained step to step, so no interval is read over more than a step or so (float
// milliseconds from the origin would be ~0.25 ms coarse after an hour).
// Collectives (tid 2): every communication call the rank's communicators make inside a training step
// (begin_step .. end_step; the flight recorder's entries, comm/flight_recorder.h) — TP / SP collectives, DDP
// bucket reductions, the distributed optimizer's gathers, grad-norm and loss reductions, batch_p2p:
//   {"ph":"X","pid":rank,"tid":2,"name":"all_reduce dp","cat":"collective","ts":us,"dur":us,
//    "args":{"step":i,"stage":s,"group":"dp","seq":n (batch_p2p: "p2p_seq"),"dtype":"float32","count":n}}
// On the CUDA backend the interval is the op's span on NCCL's comm stream (two DeviceClock marks the NCCL
// communicator makes around the call while the recorder is attached: what ran there, overlapping the
// compute row); ops without device marks (the host-tensor MPI calls) are left out. On CPU ranks it is host
// time from the call to the wait that completed it (calls not completed by end_step are left out). Calls
// outside a step (evaluation, checkpointing) are not recorded. start() grows the rank's flight-recorder ring
// to kCommRing entries; a step with more calls than that loses its oldest, counted in comm_dropped(). The
// trace summary keeps collectives out of the bubble (tools/trace_summary.h).
// Layer rows (tid 3, CPU ranks: the host clock only): the per-module intervals tools/layout_planner.h
// (`mcpp plan layout --timeline`) turns into per-layer costs — every decoder layer ("decoder.layers.<i>", global
// index), the "embedding", the "output_layer" and the "loss" scope (core/module_trace.h's ScopeTimer), forward and
// backward (a recomputed layer's forward inside a backward action counts as forward):
//   {"ph":"X","pid":rank,"tid":3,"name":"decoder.layers.3","cat":"layer","ts":us,"dur":us,
//    "args":{"step":i,"stage":s,"pass":"forward"|"backward"}}
// On the CUDA backend the host only enqueues, so no layer rows are written there (the planner then says so). The
// first 2^18 rows of the run are kept (a planner needs a few steps; a long run's trace stays bounded).
// The bubble report: per pipeline stage the measured bubble (trace_summary's, averaged over the stage's
// ranks; the first step left out as warm-up when there are more) next to the theoretical (pp-1)/(V*M+pp-1).
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/comm/communicator.h"
#include "mcpp/comm/flight_recorder.h"
#include "mcpp/core/device_clock.h"
#include "mcpp/pipeline_parallel/schedule_runner.h"

namespace mcpp::timeline {

class LayerTimer;

class TimelineRecorder {
 public:
  // device_time: intervals from a DeviceClock (needs CUDA) instead of the host clock. comm_ring: the
  // flight-recorder capacity start() ensures, so that a step's calls outlive the step (~250 bytes each).
  static constexpr size_t kCommRing = size_t{1} << 16;
  TimelineRecorder(int rank, int stage, bool device_time = false, size_t comm_ring = kCommRing);
  ~TimelineRecorder();
  // Collective on world: (device time: drain the device,) barrier, then the origin is now; attaches the
  // device clock to world's flight recorder (device time; detached by the destructor).
  void start(comm::Communicator& world);
  // The buffer run_schedule appends one training step's actions to (a new step begins).
  std::vector<pipeline_parallel::ActionTiming>* begin_step();
  // The step's communication ends (after its optimizer step): its collectives are taken from the recorder.
  void end_step();
  int64_t comm_dropped() const { return comm_dropped_; }
  // The clock run_schedule marks the compute stream with (nullptr: host timing).
  DeviceClock* device_clock() const { return clock_.get(); }
  const char* clock_name() const { return clock_ ? "device" : "host"; }
  // This rank's X events (ts relative to the origin; device time waits for the marks to complete).
  nlohmann::json events() const;

 private:
  // Device time: (ts, dur) of timings_[from, to) (whole steps) appended to *out, chaining the step anchors
  // from *anchor_mark / *anchor_us (updated); the collectives of those steps appended to *comm_out.
  void device_times(size_t from, size_t to, int64_t* anchor_mark, double* anchor_us,
                    std::vector<std::pair<double, double>>* out,
                    std::vector<std::pair<double, double>>* comm_out) const;

  int rank_, stage_;
  size_t comm_ring_;
  std::unique_ptr<DeviceClock> clock_;
  int64_t origin_mark_ = -1;
  // Device time read so far: (ts, dur) of timings_[0, resolved_.size()); the last read step's anchor.
  std::vector<std::pair<double, double>> resolved_;
  int64_t anchor_mark_ = -1;
  double anchor_us_ = 0.0;
  std::chrono::steady_clock::time_point origin_ = std::chrono::steady_clock::now();
  std::vector<pipeline_parallel::ActionTiming> timings_;
  std::vector<size_t> step_begin_;  // index into timings_ where each step starts
  // Collectives: the recorder (start()), the first entry id of the open step, the entries taken per step.
  std::shared_ptr<comm::FlightRecorder> recorder_;
  uint64_t comm_first_ = 0;
  bool step_open_ = false;
  std::vector<std::pair<int64_t, comm::RecordEntry>> comms_;  // (step, entry)
  std::vector<std::pair<double, double>> comm_resolved_;      // device time of comms_[0, size())
  int64_t comm_dropped_ = 0;
  std::unique_ptr<LayerTimer> layers_;  // host clock: the layer rows (installed by start())
};

struct TraceInfo {
  int64_t pipeline_model_parallel_size = 1, num_microbatches = 1, virtual_pipeline_model_parallel_size = 1;
  std::string clock = "host";  // "host" | "device": where the intervals were measured
};

// All ranks' events + metadata as a trace (events: one array per rank, in rank order).
nlohmann::json make_trace(const std::vector<nlohmann::json>& rank_events, const std::vector<int>& rank_stages,
                          const TraceInfo& info);

// Collective on world: gathers every rank's events; on `writer` writes the trace to path (mcpp::Error
// naming the path if it cannot be written). Returns the merged trace on every rank.
nlohmann::json gather_and_write_trace(const TimelineRecorder& rec, comm::Communicator& world, int stage,
                                      const TraceInfo& info, const std::string& path, bool writer);

// {"event":"pipeline_bubble","clock":"host"|"device","steps":n,"skipped_steps":0|1,"theoretical":x,
//  "stages":[{"stage":s,"measured":m,"ranks":n},...]}
nlohmann::json bubble_report(const nlohmann::json& trace);
std::string format_bubble_report(const nlohmann::json& report);

}  // namespace mcpp::timeline
