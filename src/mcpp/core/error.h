// mcpp::Error — the one exception type for user-facing mistakes and failed checks.
//
// Contract: library code never calls exit(); it throws mcpp::Error with a message that names the
// file / field / rank at fault. The CLI (apps/mcpp/main.cpp) prints it as one line and exits with 2.
// MCPP_CHECK(cond, fmt, args...) is for internal invariants and adds the call site.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mcpp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mcpp

#define MCPP_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      throw ::mcpp::Error(::fmt::format("{} ({}:{}: check `{}` failed)",                     \
                                        ::fmt::format(__VA_ARGS__), __FILE__, __LINE__, #cond)); \
    }                                                                                        \
  } while (0)
