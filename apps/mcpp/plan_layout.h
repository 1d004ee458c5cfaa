// `mcpp plan layout` (apps/mcpp/plan_layout.cpp): the profile-driven --pipeline-model-parallel-layout.
#pragma once
#include <string>
#include <vector>

namespace mcpp::cli {
int run_plan_layout(const std::vector<std::string>& args);  // args after "plan layout"
}  // namespace mcpp::cli
