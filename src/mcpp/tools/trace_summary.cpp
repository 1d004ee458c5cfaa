#include "mcpp/tools/trace_summary.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"

namespace mcpp::tools {

std::vector<Span> interval_union(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  std::vector<Span> out;
  for (const Span& s : spans) {
    if (s.end <= s.start) continue;
    if (!out.empty() && s.start <= out.back().end)
      out.back().end = std::max(out.back().end, s.end);
    else
      out.push_back(s);
  }
  return out;
}

double total_length(const std::vector<Span>& merged) {
  double t = 0;
  for (const Span& s : merged) t += s.end - s.start;
  return t;
}

double intersection_length(const std::vector<Span>& a, const std::vector<Span>& b) {
  double t = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const double lo = std::max(a[i].start, b[j].start), hi = std::min(a[i].end, b[j].end);
    if (hi > lo) t += hi - lo;
    if (a[i].end < b[j].end) ++i; else ++j;
  }
  return t;
}

double theoretical_bubble(int64_t pp, int64_t num_microbatches, int64_t vpp) {
  if (pp < 1 || num_microbatches < 1 || vpp < 1)
    fail("theoretical_bubble: pp ({}), num_microbatches ({}) and vpp ({}) must be >= 1", pp, num_microbatches, vpp);
  return static_cast<double>(pp - 1) / static_cast<double>(vpp * num_microbatches + pp - 1);
}

Trace parse_trace(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("traceEvents") || !j["traceEvents"].is_array())
    fail("{}: not a trace: expected an object with a 'traceEvents' array", source);
  Trace t;
  if (j.contains("otherData")) {
    if (!j["otherData"].is_object()) fail("{}: 'otherData' must be an object", source);
    t.other_data = j["otherData"];
  }
  const auto& evs = j["traceEvents"];
  for (size_t i = 0; i < evs.size(); ++i) {
    const auto& e = evs[i];
    if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string())
      fail("{}: traceEvents[{}]: expected an object with a string 'ph'", source, i);
    if (e["ph"] == "M") continue;
    if (e["ph"] != "X") fail("{}: traceEvents[{}]: unsupported ph '{}' (expected X or M)", source, i,
                             e["ph"].get<std::string>());
    for (const char* k : {"pid", "ts", "dur"})
      if (!e.contains(k) || !e[k].is_number()) fail("{}: traceEvents[{}]: missing or non-numeric '{}'", source, i, k);
    if (!e.contains("cat") || !e["cat"].is_string()) fail("{}: traceEvents[{}]: missing string 'cat'", source, i);
    TraceEvent ev;
    const std::string cat = e["cat"];
    if (cat == "forward") ev.cat = EventCat::Forward;
    else if (cat == "backward") ev.cat = EventCat::Backward;
    else if (cat == "p2p") ev.cat = EventCat::P2P;
    else if (cat == "collective") ev.cat = EventCat::Collective;
    else if (cat == "layer") ev.cat = EventCat::Layer;
    else fail("{}: traceEvents[{}]: unknown cat '{}' (forward, backward, p2p, collective or layer)", source, i, cat);
    ev.pid = e["pid"].get<int64_t>();
    ev.ts = e["ts"].get<double>();
    ev.dur = e["dur"].get<double>();
    if (ev.dur < 0) fail("{}: traceEvents[{}]: negative dur {}", source, i, ev.dur);
    ev.name = e.value("name", "");
    if (e.contains("args") && e["args"].is_object()) {
      const auto& a = e["args"];
      if (a.contains("step") && a["step"].is_number_integer()) ev.step = a["step"].get<int64_t>();
      if (a.contains("stage") && a["stage"].is_number_integer()) ev.stage = a["stage"].get<int64_t>();
      if (ev.cat == EventCat::Layer) {
        const std::string pass = a.contains("pass") && a["pass"].is_string() ? a["pass"].get<std::string>() : "";
        if (pass != "forward" && pass != "backward")
          fail("{}: traceEvents[{}]: a layer event needs args.pass \"forward\" or \"backward\"", source, i);
        ev.backward_pass = pass == "backward";
      }
    } else if (ev.cat == EventCat::Layer) {
      fail("{}: traceEvents[{}]: a layer event needs args.pass \"forward\" or \"backward\"", source, i);
    }
    t.events.push_back(std::move(ev));
  }
  return t;
}

Trace read_trace(const std::string& path) {
  // A regular file of at most 4 GiB, nesting at most kMaxJsonDepth (a Chrome trace nests 3 deep).
  return parse_trace(read_json_file(path, "trace file", {.max_bytes = uint64_t{4} << 30}), path);
}

TraceSummary summarize(const Trace& trace, int64_t skip_steps) {
  TraceSummary s;
  MCPP_CHECK(skip_steps >= 0, "trace summary: skip_steps must be >= 0, got {}", skip_steps);
  std::set<int64_t> all_steps;
  for (const auto& e : trace.events)
    if (e.cat != EventCat::Layer) all_steps.insert(e.step);
  if (skip_steps > 0 && skip_steps >= static_cast<int64_t>(all_steps.size()))
    fail("trace summary: skipping {} warm-up step(s) leaves nothing of the trace's {} step(s)", skip_steps,
         all_steps.size());
  std::set<int64_t> skipped;
  for (int64_t step : all_steps)
    if (static_cast<int64_t>(skipped.size()) < skip_steps) skipped.insert(step);
  s.steps = static_cast<int64_t>(all_steps.size() - skipped.size());
  s.skipped_steps = static_cast<int64_t>(skipped.size());
  std::vector<const TraceEvent*> kept, collectives;  // the schedule's events / the collectives row
  for (const auto& e : trace.events)
    if (e.cat != EventCat::Layer && !skipped.count(e.step))  // layer rows nest inside the compute rows
      (e.cat == EventCat::Collective ? collectives : kept).push_back(&e);
  std::map<int64_t, Span> windows;  // step -> [min start, max end] over all ranks
  for (const TraceEvent* e : kept) {
    auto [it, fresh] = windows.try_emplace(e->step, Span{e->ts, e->ts + e->dur});
    if (!fresh) it->second = {std::min(it->second.start, e->ts), std::max(it->second.end, e->ts + e->dur)};
  }
  double span = 0;
  for (const auto& [step, w] : windows) span += w.end - w.start;
  std::map<int64_t, std::vector<const TraceEvent*>> by_pid;
  for (const TraceEvent* e : kept) by_pid[e->pid].push_back(e);
  for (const auto& [pid, evs] : by_pid) {
    std::vector<Span> f, b, p, all;
    RankStats r{.pid = pid, .stage = pid};
    for (const TraceEvent* e : evs) {
      const Span sp{e->ts, e->ts + e->dur};
      (e->cat == EventCat::Forward ? f : e->cat == EventCat::Backward ? b : p).push_back(sp);
      all.push_back(sp);
      if (e->stage >= 0) r.stage = e->stage;
    }
    std::vector<Span> compute = f;
    compute.insert(compute.end(), b.begin(), b.end());
    const auto cu = interval_union(compute), pu = interval_union(p);
    r.forward_us = total_length(interval_union(f));
    r.backward_us = total_length(interval_union(b));
    r.p2p_us = total_length(pu);
    r.busy_us = total_length(cu);
    r.overlap_us = intersection_length(cu, pu);
    r.span_us = span;
    r.idle_us = span - total_length(interval_union(all));
    r.bubble = span > 0 ? 1.0 - r.busy_us / span : 0.0;
    std::vector<Span> coll;
    std::map<std::string, std::vector<Span>> by_name;
    for (const TraceEvent* e : collectives) {
      if (e->pid != pid) continue;
      coll.push_back({e->ts, e->ts + e->dur});
      by_name[e->name].push_back(coll.back());
    }
    const auto co = interval_union(coll);
    r.collective_us = total_length(co);
    r.collective_overlap_us = intersection_length(cu, co);
    for (auto& [name, spans] : by_name) {
      const auto u = interval_union(spans);
      r.calls.push_back({name, static_cast<int64_t>(spans.size()), total_length(u), intersection_length(cu, u)});
    }
    s.ranks.push_back(r);
  }
  double most = -1;
  for (const auto& r : s.ranks)
    if (r.busy_us > most) most = r.busy_us, s.slowest_pid = r.pid;
  const auto& o = trace.other_data;
  const char* keys[] = {"pipeline_model_parallel_size", "num_microbatches", "virtual_pipeline_model_parallel_size"};
  if (std::all_of(std::begin(keys), std::end(keys), [&](const char* k) { return o.contains(k) && o[k].is_number_integer(); }))
    s.theoretical = theoretical_bubble(o[keys[0]].get<int64_t>(), o[keys[1]].get<int64_t>(), o[keys[2]].get<int64_t>());
  if (o.contains("clock") && o["clock"].is_string()) s.clock = o["clock"].get<std::string>();
  return s;
}

std::string format_summary(const TraceSummary& s) {
  std::string out = fmt::format("{:>5} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8} {:>12} {:>12}\n", "rank",
                                "stage", "forward_ms", "backward_ms", "p2p_ms", "idle_ms", "overlap_ms", "span_ms",
                                "bubble", "coll_ms", "coll_overlap");
  for (const auto& r : s.ranks)
    out += fmt::format("{:>5} {:>5} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f} {:>8.4f} {:>12.3f} "
                       "{:>12.3f}\n", r.pid, r.stage, r.forward_us / 1e3, r.backward_us / 1e3, r.p2p_us / 1e3,
                       r.idle_us / 1e3, r.overlap_us / 1e3, r.span_us / 1e3, r.bubble, r.collective_us / 1e3,
                       r.collective_overlap_us / 1e3);
  if (s.slowest_pid >= 0) {
    const auto& r = *std::find_if(s.ranks.begin(), s.ranks.end(), [&](const RankStats& x) { return x.pid == s.slowest_pid; });
    out += fmt::format("slowest stage: {} (rank {}, busy {:.3f} ms)\n", r.stage, r.pid, r.busy_us / 1e3);
  }
  if (s.theoretical >= 0) out += fmt::format("theoretical bubble: {:.4f}\n", s.theoretical);
  const double steps = static_cast<double>(std::max<int64_t>(s.steps, 1));
  bool header = false;
  for (const auto& r : s.ranks)
    for (const CallStats& c : r.calls) {
      if (!header)
        out += fmt::format("collectives per step:\n{:>5} {:<24} {:>8} {:>10} {:>12}\n", "rank", "call", "calls", "ms",
                           "overlap_ms");
      header = true;
      out += fmt::format("{:>5} {:<24} {:>8.1f} {:>10.3f} {:>12.3f}\n", r.pid, c.name, c.count / steps,
                         c.us / steps / 1e3, c.overlap_us / steps / 1e3);
    }
  out += fmt::format("intervals: {} time; {} step(s) summarized", s.clock, s.steps);
  out += s.skipped_steps > 0 ? fmt::format(" (the first {} skipped as warm-up)\n", s.skipped_steps) : "\n";
  return out;
}

}  // namespace mcpp::tools
