#include "mcpp/training/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"
#include "mcpp/core/module_trace.h"
#include "mcpp/tools/trace_summary.h"

namespace mcpp::timeline {
namespace {

using pipeline_parallel::ActionKind;

double micros(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// Bytes of s as int32 values [n] (all_gather moves tensors).
Tensor to_tensor(const std::string& s, int64_t n) {
  Tensor t = Tensor::empty({n}, DType::I32);
  int32_t* p = t.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = i < static_cast<int64_t>(s.size()) ? static_cast<unsigned char>(s[i]) : 0;
  return t;
}

// A layer row's module: "embedding", "output_layer", "loss" or "decoder.layers.<digits>".
bool is_layer_row(std::string_view name) {
  constexpr std::string_view kPrefix = "decoder.layers.";
  if (name == "embedding" || name == "output_layer" || name == "loss") return true;
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size()) return false;
  return std::all_of(name.begin() + kPrefix.size(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

// The layer rows (timeline.h): a stack of the open scopes, the intervals of those that are layer rows.
class LayerTimer final : public ScopeTimer {
 public:
  struct Row {
    std::string name;
    bool backward;
    std::chrono::steady_clock::time_point start, end;
    int64_t step;
  };
  void on_begin(const char* name, bool backward) override {
    const bool keep = on_ && rows_.size() < kMaxRows && is_layer_row(name);
    open_.push_back(keep ? static_cast<int64_t>(rows_.size()) : -1);
    if (open_.back() >= 0) rows_.push_back({name, backward, std::chrono::steady_clock::now(), {}, step_});
  }
  void on_end() override {
    if (open_.empty()) return;  // installed inside an open scope
    if (open_.back() >= 0) rows_[static_cast<size_t>(open_.back())].end = std::chrono::steady_clock::now();
    open_.pop_back();
  }
  static constexpr size_t kMaxRows = size_t{1} << 18;  // the first ones kept: a planner needs a few steps
  bool on_ = false;  // inside a training step
  int64_t step_ = 0;
  std::vector<Row> rows_;

 private:
  std::vector<int64_t> open_;  // per open scope: its row, or -1
};

TimelineRecorder::TimelineRecorder(int rank, int stage, bool device_time, size_t comm_ring)
    : rank_(rank), stage_(stage), comm_ring_(comm_ring) {
  if (device_time) clock_ = std::make_unique<DeviceClock>();
}

TimelineRecorder::~TimelineRecorder() {
  if (recorder_ && clock_) recorder_->set_device_clock(nullptr);
  if (layers_) set_scope_timer(nullptr);
}

void TimelineRecorder::start(comm::Communicator& world) {
  if (clock_) cuda_synchronize();  // the origin mark then runs as soon as it is enqueued
  world.barrier().wait();
  origin_ = std::chrono::steady_clock::now();
  if (clock_) origin_mark_ = clock_->mark();
  recorder_ = world.recorder_ptr();
  if (recorder_) recorder_->ensure_capacity(comm_ring_);
  if (clock_ && recorder_) recorder_->set_device_clock(clock_.get());
  if (!clock_) {  // layer rows on the host clock only (timeline.h)
    layers_ = std::make_unique<LayerTimer>();
    set_scope_timer(layers_.get());
  }
}

std::vector<pipeline_parallel::ActionTiming>* TimelineRecorder::begin_step() {
  // The step before the previous one has long finished on the device: read its times, retire its marks.
  if (clock_ && step_begin_.size() >= 2) {
    const size_t to = step_begin_[step_begin_.size() - 1];
    device_times(resolved_.size(), to, &anchor_mark_, &anchor_us_, &resolved_, &comm_resolved_);
    if (anchor_mark_ >= 0) clock_->retire_before(anchor_mark_);  // the anchor stays for the next step's
  }
  step_begin_.push_back(timings_.size());
  if (recorder_) comm_first_ = recorder_->total_recorded();
  step_open_ = true;
  if (layers_) layers_->on_ = true, layers_->step_ = static_cast<int64_t>(step_begin_.size()) - 1;
  return &timings_;
}

void TimelineRecorder::end_step() {
  if (layers_) layers_->on_ = false;
  if (!step_open_ || !recorder_) return;
  step_open_ = false;
  const uint64_t end = recorder_->total_recorded();
  const auto step = static_cast<int64_t>(step_begin_.size()) - 1;
  uint64_t kept_from = end;  // the oldest id of the step still in the ring
  for (comm::RecordEntry& e : recorder_->entries(comm_first_)) {  // the step's calls only
    if (e.id >= end) continue;
    kept_from = std::min(kept_from, e.id);
    const bool timed = clock_ ? e.device_start >= 0 && e.device_end >= 0 : e.end_steady_ns > 0;
    if (!timed) continue;
    e.group_ranks = {}, e.peers = {};  // not in the trace: ~250 bytes per call kept, about its JSON's size
    comms_.emplace_back(step, std::move(e));
  }
  comm_dropped_ += static_cast<int64_t>(kept_from - comm_first_);
}

void TimelineRecorder::device_times(size_t from, size_t to, int64_t* anchor_mark, double* anchor_us,
                                    std::vector<std::pair<double, double>>* out,
                                    std::vector<std::pair<double, double>>* comm_out) const {
  for (size_t i = from; i < to; ++i) {
    const auto& t = timings_[i];
    MCPP_CHECK(t.device_start >= 0 && t.device_end >= 0, "timeline: action {} has no device marks",
               pipeline_parallel::to_string(t.action));
    const auto first = std::lower_bound(step_begin_.begin(), step_begin_.end(), i);
    if (first != step_begin_.end() && *first == i) {  // a step's first action: the anchor, then its collectives
      *anchor_us = *anchor_mark < 0 ? clock_->micros_between(origin_mark_, t.device_start)
                                    : *anchor_us + clock_->micros_between(*anchor_mark, t.device_start);
      *anchor_mark = t.device_start;
      const auto step = static_cast<int64_t>(first - step_begin_.begin());
      for (size_t c = comm_out->size(); c < comms_.size() && comms_[c].first <= step; ++c) {
        const comm::RecordEntry& e = comms_[c].second;
        comm_out->emplace_back(*anchor_us + clock_->micros_between(*anchor_mark, e.device_start),
                               clock_->micros_between(e.device_start, e.device_end));
      }
    }
    out->emplace_back(*anchor_us + clock_->micros_between(*anchor_mark, t.device_start),
                      clock_->micros_between(t.device_start, t.device_end));
  }
}

nlohmann::json TimelineRecorder::events() const {
  nlohmann::json out = nlohmann::json::array();
  std::vector<std::pair<double, double>> device = resolved_, comm_device = comm_resolved_;  // + those not read
  if (clock_) {
    int64_t anchor_mark = anchor_mark_;
    double anchor_us = anchor_us_;
    device_times(resolved_.size(), timings_.size(), &anchor_mark, &anchor_us, &device, &comm_device);
  }
  const int64_t origin_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(origin_.time_since_epoch()).count();  // steady
  size_t step = 0;
  for (size_t i = 0; i < timings_.size(); ++i) {
    while (step + 1 < step_begin_.size() && i >= step_begin_[step + 1]) ++step;
    const auto& t = timings_[i];
    const bool comm = t.action.kind == ActionKind::Comm;
    double ts = micros(t.start - origin_), dur = micros(t.end - t.start);
    if (clock_) std::tie(ts, dur) = device[i];
    nlohmann::json args{{"step", static_cast<int64_t>(step)}, {"stage", stage_}};
    if (comm) {
      args["ops"] = pipeline_parallel::to_string(t.action);
    } else {
      args["microbatch"] = t.action.microbatch;
      args["chunk"] = t.action.chunk;
    }
    out.push_back({{"ph", "X"},
                   {"pid", rank_},
                   {"tid", comm ? 1 : 0},
                   {"name", comm ? pipeline_parallel::comm_name(t.action) : pipeline_parallel::to_string(t.action)},
                   {"cat", comm ? "p2p" : t.action.kind == ActionKind::Forward ? "forward" : "backward"},
                   {"ts", ts},
                   {"dur", dur},
                   {"args", std::move(args)}});
  }
  for (size_t c = 0; c < comms_.size(); ++c) {
    const auto& [step, e] = comms_[c];
    if (clock_ && c >= comm_device.size()) break;  // a step with no actions has no anchor (not in training)
    const bool p2p = e.op == "batch_p2p";
    const double ts = clock_ ? comm_device[c].first : static_cast<double>(e.start_steady_ns - origin_ns) / 1e3;
    const double dur = clock_ ? comm_device[c].second : static_cast<double>(e.end_steady_ns - e.start_steady_ns) / 1e3;
    nlohmann::json args{{"step", step}, {"stage", stage_}, {"group", e.group}, {p2p ? "p2p_seq" : "seq",
                        p2p ? e.p2p_seq : e.seq}, {"dtype", e.dtype}, {"count", e.count}};
    if (!e.reduce_op.empty()) args["reduce_op"] = e.reduce_op;
    out.push_back({{"ph", "X"}, {"pid", rank_}, {"tid", 2}, {"name", fmt::format("{} {}", e.op, e.group)},
                   {"cat", "collective"}, {"ts", ts}, {"dur", dur}, {"args", std::move(args)}});
  }
  if (layers_) {
    for (const LayerTimer::Row& l : layers_->rows_) {
      if (l.end < l.start) continue;  // still open (not possible after a step)
      out.push_back({{"ph", "X"}, {"pid", rank_}, {"tid", 3}, {"name", l.name}, {"cat", "layer"},
                     {"ts", micros(l.start - origin_)}, {"dur", micros(l.end - l.start)},
                     {"args", {{"step", l.step}, {"stage", stage_}, {"pass", l.backward ? "backward" : "forward"}}}});
    }
  }
  return out;
}

nlohmann::json make_trace(const std::vector<nlohmann::json>& rank_events, const std::vector<int>& rank_stages,
                          const TraceInfo& info) {
  nlohmann::json evs = nlohmann::json::array();
  for (size_t r = 0; r < rank_events.size(); ++r) {
    evs.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r},
                   {"args", {{"name", fmt::format("rank {} (pp stage {})", r, rank_stages.at(r))}}}});
    evs.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    evs.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 1}, {"args", {{"name", "p2p"}}}});
    evs.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 2},
                   {"args", {{"name", info.clock == "device" ? "collectives (comm stream)" : "collectives"}}}});
    if (info.clock != "device")
      evs.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", 3}, {"args", {{"name", "layers"}}}});
    for (const auto& e : rank_events[r]) evs.push_back(e);
  }
  return {{"traceEvents", std::move(evs)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"pipeline_model_parallel_size", info.pipeline_model_parallel_size},
            {"num_microbatches", info.num_microbatches},
            {"virtual_pipeline_model_parallel_size", info.virtual_pipeline_model_parallel_size},
            {"clock", info.clock}}}};
}

nlohmann::json gather_and_write_trace(const TimelineRecorder& rec, comm::Communicator& world, int stage,
                                      const TraceInfo& info, const std::string& path, bool writer) {
  const std::string mine = nlohmann::json{{"stage", stage}, {"events", rec.events()}}.dump();
  const int n = world.size();
  Tensor size = Tensor::empty({1}, DType::I32), sizes = Tensor::empty({n}, DType::I32);
  size.data<int32_t>()[0] = static_cast<int32_t>(mine.size());
  world.host().all_gather(sizes, size).wait();
  int64_t max_len = 1;
  for (int r = 0; r < n; ++r) max_len = std::max<int64_t>(max_len, sizes.data<int32_t>()[r]);
  Tensor all = Tensor::empty({n * max_len}, DType::I32);
  world.host().all_gather(all, to_tensor(mine, max_len)).wait();
  std::vector<nlohmann::json> rank_events;
  std::vector<int> stages;
  for (int r = 0; r < n; ++r) {
    std::string s(static_cast<size_t>(sizes.data<int32_t>()[r]), '\0');
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(all.data<int32_t>()[r * max_len + static_cast<int64_t>(i)]);
    nlohmann::json j = nlohmann::json::parse(s);
    stages.push_back(j["stage"].get<int>());
    rank_events.push_back(std::move(j["events"]));
  }
  nlohmann::json trace = make_trace(rank_events, stages, info);
  if (writer) {
    std::ofstream out(path);
    if (!out) fail("timeline: cannot write trace file '{}'", path);
    out << trace.dump() << "\n";
    if (!out) fail("timeline: error writing trace file '{}'", path);
  }
  return trace;
}

nlohmann::json bubble_report(const nlohmann::json& trace) {
  const tools::Trace parsed = tools::parse_trace(trace, "timeline");
  std::set<int64_t> steps;
  for (const auto& e : parsed.events) steps.insert(e.step);
  const tools::TraceSummary s = tools::summarize(parsed, steps.size() > 1 ? 1 : 0);  // step 0: warm-up
  std::map<int64_t, std::pair<double, int>> by_stage;  // stage -> (sum of bubbles, ranks)
  for (const auto& r : s.ranks) {
    auto& [sum, count] = by_stage[r.stage];
    sum += r.bubble;
    ++count;
  }
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& [stage, v] : by_stage)
    stages.push_back({{"stage", stage}, {"measured", v.first / v.second}, {"ranks", v.second}});
  const std::string clock = trace.contains("otherData") ? trace["otherData"].value("clock", "host") : "host";
  return {{"event", "pipeline_bubble"}, {"clock", clock},          {"steps", s.steps},
          {"skipped_steps", s.skipped_steps}, {"theoretical", s.theoretical}, {"stages", std::move(stages)}};
}

std::string format_bubble_report(const nlohmann::json& report) {
  std::string out = fmt::format(
      " pipeline bubble ({} time, {} step(s){}; theoretical (pp-1)/(V*M+pp-1) = {:.4f})\n{:>8} {:>10} {:>12}\n",
      report.value("clock", "host"), report.value("steps", int64_t{0}),
      report.value("skipped_steps", int64_t{0}) > 0 ? " after the warm-up step" : "",
      report["theoretical"].get<double>(), "stage", "measured", "theoretical");
  for (const auto& s : report["stages"])
    out += fmt::format("{:>8} {:>10.4f} {:>12.4f}\n", s["stage"].get<int64_t>(), s["measured"].get<double>(),
                       report["theoretical"].get<double>());
  return out;
}

}  // namespace mcpp::timeline
