// MCPP_PROFILE_OPS: see op_profile.h.
#include "mcpp/kernels/op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "mcpp/core/device_memory.h"

namespace mcpp::ops {
namespace {

struct Entry {
  int64_t calls = 0;
  double ms = 0;
};

class Registry {
 public:
  void add(const std::string& key, double ms) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[key];
    ++e.calls;
    e.ms += ms;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.clear();
  }
  ~Registry() {
    if (entries_.empty()) return;
    std::vector<std::pair<std::string, Entry>> rows(entries_.begin(), entries_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& r : rows) total += r.second.ms;
    std::string out = fmt::format("---- op profile (MCPP_PROFILE_OPS): {:.1f} ms in ops\n", total);
    out += fmt::format("{:<34} {:>8} {:>11} {:>7} {:>10}\n", "op (backend)", "calls", "total ms", "share", "mean us");
    for (const auto& [k, e] : rows)
      out += fmt::format("{:<34} {:>8} {:>11.2f} {:>6.1f}% {:>10.1f}\n", k, e.calls, e.ms, 100.0 * e.ms / total,
                         1000.0 * e.ms / static_cast<double>(e.calls));
    std::fputs(out.c_str(), stderr);
  }

 private:
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

bool op_profile_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MCPP_PROFILE_OPS");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void op_profile_reset() {
  if (op_profile_enabled()) registry().clear();
}

void OpTimer::start() {
  registry();  // constructed before first use, so destroyed (and printed) after the last op
  if (cuda_) cuda_synchronize();
  t0_ = std::chrono::steady_clock::now();
}

void OpTimer::stop() {
  if (cuda_) cuda_synchronize();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  registry().add(std::string(name_) + (cuda_ ? " (cuda)" : " (cpu)"), ms);
}

}  // namespace mcpp::ops
