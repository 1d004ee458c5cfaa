#include "mcpp/training/activation_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace mcpp::timeline {

nlohmann::json gather_activation_report(comm::Communicator& world, int stage, const StageMemory& mine) {
  constexpr int64_t kFields = 4;
  Tensor in = Tensor::empty({kFields}, DType::I64);
  const int64_t vals[kFields] = {stage, mine.max_in_flight, mine.peak_activation_bytes, mine.context_bytes};
  std::copy_n(vals, kFields, in.data<int64_t>());
  Tensor all = Tensor::empty({world.size() * kFields}, DType::I64);
  world.host().all_gather(all, in).wait();
  std::map<int64_t, nlohmann::json> stages;
  for (int r = 0; r < world.size(); ++r) {
    const int64_t* v = all.data<int64_t>() + r * kFields;
    auto [it, fresh] = stages.try_emplace(v[0], nlohmann::json{{"stage", v[0]}, {"in_flight", 0}, {"peak_bytes", 0},
                                                                {"context_bytes", 0}, {"ranks", 0}});
    nlohmann::json& s = it->second;
    s["in_flight"] = std::max(s["in_flight"].get<int64_t>(), v[1]);
    s["peak_bytes"] = std::max(s["peak_bytes"].get<int64_t>(), v[2]);
    s["context_bytes"] = std::max(s["context_bytes"].get<int64_t>(), v[3]);
    s["ranks"] = s["ranks"].get<int64_t>() + 1;
  }
  nlohmann::json report{{"event", "pipeline_activation_memory"}, {"stages", nlohmann::json::array()}};
  for (auto& [k, s] : stages) report["stages"].push_back(s);
  return report;
}

std::string format_activation_report(const nlohmann::json& report) {
  std::string out = fmt::format(" pipeline activation memory (live per-microbatch contexts)\n{:>8} {:>10} {:>14} {:>14}\n",
                                "stage", "in flight", "peak MiB", "per mb MiB");
  for (const auto& s : report["stages"])
    out += fmt::format("{:>8} {:>10} {:>14.3f} {:>14.3f}\n", s["stage"].get<int64_t>(), s["in_flight"].get<int64_t>(),
                       static_cast<double>(s["peak_bytes"].get<int64_t>()) / (1 << 20),
                       static_cast<double>(s["context_bytes"].get<int64_t>()) / (1 << 20));
  return out;
}

}  // namespace mcpp::timeline
