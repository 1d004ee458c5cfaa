// Environment-controlled SIGKILL at named points; see fault_injection.h.
#include "mcpp/dist_checkpointing/fault_injection.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

namespace mcpp::dist_checkpointing {
namespace {
int64_t g_iteration = -1;
int g_rank = 0;
}

void set_fault_context(int64_t iteration, int rank) {
  g_iteration = iteration;
  g_rank = rank;
}

void fault_point(const char* name) {
  const char* at = std::getenv("MCPP_FAULT_KILL_AT");
  if (!at || std::strcmp(at, name) != 0) return;
  if (const char* r = std::getenv("MCPP_FAULT_KILL_RANK"); r && *r && std::atoi(r) != g_rank) return;
  if (const char* it = std::getenv("MCPP_FAULT_KILL_ITERATION"); it && *it && std::atoll(it) != g_iteration)
    return;
  std::raise(SIGKILL);
}

}  // namespace mcpp::dist_checkpointing
