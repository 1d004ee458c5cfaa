#include "mcpp/training/activation_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace mcpp::timeline {

nlohmann::json gather_activation_report(comm::Communicator& world, int stage, const StageMemory& mine) {
  constexpr int64_t kFields = 5;
  Tensor in = Tensor::empty({kFields}, DType::I64);
  const int64_t vals[kFields] = {stage, mine.max_in_flight, mine.peak_activation_bytes, mine.context_bytes,
                                 mine.model_state_bytes};
  std::copy_n(vals, kFields, in.data<int64_t>());
  Tensor all = Tensor::empty({world.size() * kFields}, DType::I64);
  world.host().all_gather(all, in).wait();
  std::map<int64_t, nlohmann::json> stages;
  for (int r = 0; r < world.size(); ++r) {
    const int64_t* v = all.data<int64_t>() + r * kFields;
    auto [it, fresh] = stages.try_emplace(v[0], nlohmann::json{{"stage", v[0]}, {"in_flight", 0}, {"peak_bytes", 0},
                                                                {"context_bytes", 0}, {"model_state_bytes", 0},
                                                                {"ranks", 0}});
    nlohmann::json& s = it->second;
    s["in_flight"] = std::max(s["in_flight"].get<int64_t>(), v[1]);
    s["peak_bytes"] = std::max(s["peak_bytes"].get<int64_t>(), v[2]);
    s["context_bytes"] = std::max(s["context_bytes"].get<int64_t>(), v[3]);
    s["model_state_bytes"] = std::max(s["model_state_bytes"].get<int64_t>(), v[4]);
    s["ranks"] = s["ranks"].get<int64_t>() + 1;
  }
  nlohmann::json report{{"event", "pipeline_activation_memory"}, {"stages", nlohmann::json::array()}};
  for (auto& [k, s] : stages) report["stages"].push_back(s);
  return report;
}

void add_planned_activations(nlohmann::json& report, const tools::MemoryPlan& plan) {
  for (auto& s : report["stages"]) {
    const tools::StageMemory& st = plan.stages.at(s["stage"].get<size_t>());
    int64_t largest = 0;
    for (const tools::ChunkMemory& c : st.chunks) largest = std::max(largest, c.context_bytes);
    s["planned_in_flight"] = st.in_flight;
    s["planned_peak_bytes"] = st.peak_activation_bytes;
    s["planned_context_bytes"] = largest;
    s["planned_model_state_bytes"] = static_cast<int64_t>(st.model_state_bytes());
  }
}

std::string format_activation_report(const nlohmann::json& report) {
  std::string out = fmt::format(" activation memory (live per-microbatch contexts; measured / planned)\n"
                                "{:>8} {:>10} {:>14} {:>14} {:>14}\n",
                                "stage", "in flight", "peak MiB", "per mb MiB", "planned MiB");
  const auto mib = [](const nlohmann::json& v) { return static_cast<double>(v.get<int64_t>()) / (1 << 20); };
  for (const auto& s : report["stages"])
    out += fmt::format("{:>8} {:>10} {:>14.3f} {:>14.3f} {:>14}\n", s["stage"].get<int64_t>(),
                       s["in_flight"].get<int64_t>(), mib(s["peak_bytes"]), mib(s["context_bytes"]),
                       s.contains("planned_peak_bytes") ? fmt::format("{:.3f}", mib(s["planned_peak_bytes"])) : "-");
  return out;
}

}  // namespace mcpp::timeline
