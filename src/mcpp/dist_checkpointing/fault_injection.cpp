// Environment-controlled SIGKILL at named points; see fault_injection.h.
#include "mcpp/dist_checkpointing/fault_injection.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mcpp/core/error.h"

namespace mcpp::dist_checkpointing {
namespace {
std::atomic<int64_t> g_iteration{-1};  // atomics: the async writer thread reads them
std::atomic<int> g_rank{0};
}

void set_fault_context(int64_t iteration, int rank) {
  g_iteration = iteration;
  g_rank = rank;
}

namespace {
bool selected(const char* env, const char* name) {
  const char* at = std::getenv(env);
  if (!at || std::strcmp(at, name) != 0) return false;
  if (const char* r = std::getenv("MCPP_FAULT_KILL_RANK"); r && *r && std::atoi(r) != g_rank) return false;
  if (const char* it = std::getenv("MCPP_FAULT_KILL_ITERATION"); it && *it && std::atoll(it) != g_iteration)
    return false;
  return true;
}
}  // namespace

void fault_point(const char* name) {
  if (selected("MCPP_FAULT_KILL_AT", name)) std::raise(SIGKILL);
  if (selected("MCPP_FAULT_FAIL_AT", name)) fail("injected failure at {} (MCPP_FAULT_FAIL_AT)", name);
}

}  // namespace mcpp::dist_checkpointing
