// The Python interpreter the oracle scripts (tests/oracle/*.py: PyTorch, numpy, Megatron transcriptions) run under.
// Default /usr/bin/python3: Debian's, where `make test` installs python3-torch / python3-numpy. A machine whose
// torch lives elsewhere (the GPU machine: a pip build of PyTorch under the `python3` first on PATH) sets
// MCPP_ORACLE_PYTHON, e.g. `MCPP_ORACLE_PYTHON=python3 mcpp_tests`. Returns the command prefix with a trailing space.
#pragma once

#include <cstdlib>
#include <string>

namespace mcpp::test {

inline std::string oracle_python() {
  const char* env = std::getenv("MCPP_ORACLE_PYTHON");
  return std::string(env != nullptr && *env != '\0' ? env : "/usr/bin/python3") + " ";
}

}  // namespace mcpp::test
