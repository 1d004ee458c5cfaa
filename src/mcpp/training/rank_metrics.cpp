// Per-rank step metrics, their world gather, Megatron's timer report and the straggler report (rank_metrics.h).
#include "mcpp/training/rank_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/tensor.h"

namespace mcpp {
namespace {

constexpr int kCols = 2 + kNumTimers;

// "VmRSS:    123456 kB" -> bytes; 0 when absent.
int64_t proc_status_bytes(const std::string& status, const std::string& field) {
  const size_t at = status.find(field + ":");
  if (at == std::string::npos) return 0;
  std::istringstream in(status.substr(at + field.size() + 1));
  int64_t kb = 0;
  in >> kb;
  return kb * 1024;
}

std::string dotted(std::string_view name) {  // Megatron's (name + ' ').ljust(48, '.')
  std::string s = std::string(name) + " ";
  if (s.size() < 48) s.append(48 - s.size(), '.');
  return s;
}

}  // namespace

MemoryNow memory_now(Device device) {
  if (device == Device::CUDA) {
    const CudaMemoryStats m = cuda_memory_stats();
    return {"device", static_cast<int64_t>(m.allocated), static_cast<int64_t>(m.reserved),
            static_cast<int64_t>(m.peak)};
  }
  std::ifstream f("/proc/self/status");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string status = ss.str();
  const int64_t rss = proc_status_bytes(status, "VmRSS");
  return {"host", rss, rss, proc_status_bytes(status, "VmHWM")};
}

nlohmann::json to_json(const MemoryNow& m) {
  return {{"kind", m.kind},
          {"allocated_bytes", m.allocated_bytes},
          {"reserved_bytes", m.reserved_bytes},
          {"peak_bytes", m.peak_bytes}};
}

double RankWindow::step_ms_mean() const {
  return step_ms.empty() ? 0.0
                         : std::accumulate(step_ms.begin(), step_ms.end(), 0.0) / static_cast<double>(step_ms.size());
}

double RankWindow::step_ms_max() const {
  return step_ms.empty() ? 0.0 : *std::max_element(step_ms.begin(), step_ms.end());
}

nlohmann::json rank_record(int64_t iteration, int rank, const RankWindow& w, const MemoryNow& mem, int64_t tokens) {
  nlohmann::json timers = nlohmann::json::object();
  const auto n = static_cast<double>(std::max<size_t>(w.step_ms.size(), 1));
  for (int i = 0; i < kNumTimers; ++i)
    if (w.timers_ms[static_cast<size_t>(i)] > 0.0)
      timers[std::string(timer_name(static_cast<TimerId>(i)))] = w.timers_ms[static_cast<size_t>(i)] / n;
  return {{"event", "train"},       {"iteration", iteration},         {"rank", rank},
          {"iterations", w.step_ms.size()}, {"step_ms", w.step_ms}, {"step_ms_mean", w.step_ms_mean()},
          {"step_ms_max", w.step_ms_max()}, {"timers_ms", timers},   {"memory", to_json(mem)},
          {"tokens", tokens}};
}

RanksSummary gather_ranks(comm::Communicator& world, const RankWindow& mine) {
  Tensor row = Tensor::empty({kCols});
  float* r = row.data<float>();
  const auto n = static_cast<double>(std::max<size_t>(mine.step_ms.size(), 1));
  r[0] = static_cast<float>(mine.step_ms_mean());
  r[1] = static_cast<float>(mine.step_ms_max());
  for (int i = 0; i < kNumTimers; ++i) r[2 + i] = static_cast<float>(mine.timers_ms[static_cast<size_t>(i)] / n);
  Tensor all = Tensor::empty({static_cast<int64_t>(world.size()), kCols});
  world.host().all_gather(all, row).wait();
  RanksSummary s;
  s.rows.resize(static_cast<size_t>(world.size()));
  for (int k = 0; k < world.size(); ++k)
    for (int c = 0; c < kCols; ++c)
      s.rows[static_cast<size_t>(k)][static_cast<size_t>(c)] = all.data<float>()[k * kCols + c];
  return s;
}

int RanksSummary::slowest() const {
  return static_cast<int>(std::max_element(rows.begin(), rows.end(), [](auto& a, auto& b) { return a[0] < b[0]; }) -
                          rows.begin());
}
int RanksSummary::fastest() const {
  return static_cast<int>(std::min_element(rows.begin(), rows.end(), [](auto& a, auto& b) { return a[0] < b[0]; }) -
                          rows.begin());
}
double RanksSummary::step_min() const { return rows[static_cast<size_t>(fastest())][0]; }
double RanksSummary::step_max() const { return rows[static_cast<size_t>(slowest())][0]; }
double RanksSummary::step_median() const {
  std::vector<double> v;
  for (const auto& r : rows) v.push_back(r[0]);
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string format_timers(const RanksSummary& s, const std::string& option, int level) {
  std::string out;
  for (int i = 0; i < kNumTimers; ++i) {
    const auto id = static_cast<TimerId>(i);
    if (timer_level(id) > level) continue;
    const size_t c = static_cast<size_t>(2 + i);
    if (option == "all") {
      std::string lines;
      for (size_t k = 0; k < s.rows.size(); ++k)
        if (s.rows[k][c] > 0.0) lines += fmt::format("\n     rank {:2d}: {:.2f}", k, s.rows[k][c]);
      if (!lines.empty()) out += fmt::format("\n  {}:{}", timer_name(id), lines);
      continue;
    }
    double lo = 0, hi = 0;
    bool any = false;
    for (const auto& r : s.rows) {
      if (r[c] <= 0.0) continue;  // Megatron: ranks without the timer are left out
      lo = any ? std::min(lo, r[c]) : r[c];
      hi = any ? std::max(hi, r[c]) : r[c];
      any = true;
    }
    if (!any) continue;
    out += option == "max" ? fmt::format("\n    {}: {:.2f}", dotted(timer_name(id)), hi)
                           : fmt::format("\n    {}: ({:.2f}, {:.2f})", dotted(timer_name(id)), lo, hi);
  }
  if (out.empty()) return "";
  const char* head = option == "max" ? "max time across ranks (ms):"
                     : option == "all" ? "times across ranks (ms):"
                                       : "(min, max) time across ranks (ms):";
  return head + out;
}

nlohmann::json straggler_json(const RanksSummary& s, double threshold_percent) {
  const int slow = s.slowest(), fast = s.fastest();
  auto phases = [&](int rank) {  // [[name, ms], ...] in Megatron's order: the step's phases and the schedule's parts
    static constexpr TimerId kPhases[] = {TimerId::ForwardBackward, TimerId::ForwardCompute, TimerId::BackwardCompute,
                                          TimerId::AllGradsSync, TimerId::Optimizer, TimerId::ParamsAllGather};
    nlohmann::json p = nlohmann::json::array();
    for (TimerId id : kPhases) {
      const double v = s.rows[static_cast<size_t>(rank)][static_cast<size_t>(2 + static_cast<int>(id))];
      if (v > 0.0) p.push_back({std::string(timer_name(id)), v});
    }
    return p;
  };
  const double median = s.step_median();
  nlohmann::json stragglers = nlohmann::json::array();
  for (size_t k = 0; k < s.rows.size(); ++k) {
    const double v = s.rows[k][0];
    if (median > 0.0 && v > median * (1.0 + threshold_percent / 100.0))
      stragglers.push_back({{"rank", k}, {"step_ms", v}, {"slower_percent", 100.0 * (v / median - 1.0)}});
  }
  return {{"event", "straggler"},
          {"slowest", {{"rank", slow}, {"step_ms", s.step_max()}, {"phases_ms", phases(slow)}}},
          {"fastest", {{"rank", fast}, {"step_ms", s.step_min()}, {"phases_ms", phases(fast)}}},
          {"ratio", s.step_min() > 0.0 ? s.step_max() / s.step_min() : 0.0},
          {"median_step_ms", median},
          {"threshold_percent", threshold_percent},
          {"stragglers", stragglers}};
}

std::string format_straggler(const nlohmann::json& r) {
  auto side = [](const nlohmann::json& x) {
    std::string p;
    for (const auto& e : x.at("phases_ms"))
      p += fmt::format(", {} {:.2f}", e[0].get<std::string>(), e[1].get<double>());
    return fmt::format("rank {} step {:.2f} ms{}", x.at("rank").get<int>(), x.at("step_ms").get<double>(), p);
  };
  std::string out = fmt::format(" straggler report | slowest: {} | fastest: {} | max/min ratio: {:.3f} |\n",
                                side(r.at("slowest")), side(r.at("fastest")), r.at("ratio").get<double>());
  for (const auto& s : r.at("stragglers"))
    out += fmt::format(" straggler: rank {} step time {:.2f} ms is {:.1f}% above the median {:.2f} ms (threshold "
                       "{:.1f}%)\n",
                       s.at("rank").get<int>(), s.at("step_ms").get<double>(), s.at("slower_percent").get<double>(),
                       r.at("median_step_ms").get<double>(), r.at("threshold_percent").get<double>());
  return out;
}

}  // namespace mcpp
