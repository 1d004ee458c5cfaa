// Shared helpers of every package's tests: the message of the mcpp::Error (core/error.h) a call throws.
#pragma once
#include <string>

#include "mcpp/core/error.h"

namespace mcpp::testing {

// The mcpp::Error message `fn` throws, or "" when it returns.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mcpp::testing
