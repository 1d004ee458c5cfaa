// The Python interpreter the oracle scripts (tests/oracle/*.py: PyTorch, numpy, Megatron transcriptions) run under.
// Default /usr/bin/python3: Debian's, where `make test` installs python3-torch / python3-numpy. A machine whose
// torch lives elsewhere (the GPU machine: a pip build of PyTorch under the `python3` first on PATH) sets
// MCPP_ORACLE_PYTHON, e.g. `MCPP_ORACLE_PYTHON=python3 mcpp_tests`. Returns the command prefix with a trailing space.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace mcpp::test {

inline std::string oracle_python() {
  const char* env = std::getenv("MCPP_ORACLE_PYTHON");
  return std::string(env != nullptr && *env != '\0' ? env : "/usr/bin/python3") + " ";
}

// Runs `<oracle_python> <MCPP_SOURCE_DIR-relative script> <dir>` and returns its exit status and output (the
// oracle prints its errors; a non-zero status is a mismatch).
inline std::pair<int, std::string> run_oracle_script(const std::string& script_path, const std::string& dir) {
  const std::string cmd = oracle_python() + script_path + " " + dir + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "cannot run " + cmd};
  std::string out;
  for (char buf[256]; fgets(buf, sizeof buf, p);) out += buf;
  return {pclose(p), cmd + "\n" + out};
}

}  // namespace mcpp::test
