// Shared by the libFuzzer targets (tests/fuzz/*_fuzz.cpp; built and run by tests/fuzz/run_fuzz.sh):
//   scratch(name)         a per-process scratch path under /dev/shm (or $TMPDIR) for parsers that read files
//   write_file(path, s)   writes the bytes (a short write is not a finding: the input is skipped)
//   split(data, size, n)  cuts the input at its first n-1 "\n--\n" separators (missing parts are empty)
//   MCPP_FUZZ_CALL(expr)  runs expr; an mcpp::Error is an expected outcome, anything else escapes to libFuzzer
//                         (an uncaught exception aborts: a finding), as does a crash or a sanitizer report.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "mcpp/core/error.h"

namespace mcpp::fuzz {

inline std::string scratch(const std::string& name) {
  static const std::string dir = [] {
    std::string base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
    std::string d = base + "/mcpp_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir + "/" + name;
}

inline bool write_file(const std::string& path, std::string_view s) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size();
  return std::fclose(f) == 0 && ok;
}

inline std::vector<std::string_view> split(const uint8_t* data, size_t size, size_t n) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> out;
  while (out.size() + 1 < n) {
    const size_t at = in.find("\n--\n");
    if (at == std::string_view::npos) break;
    out.push_back(in.substr(0, at));
    in.remove_prefix(at + 4);
  }
  out.push_back(in);
  while (out.size() < n) out.emplace_back();
  return out;
}

}  // namespace mcpp::fuzz

#define MCPP_FUZZ_CALL(expr) \
  do {                       \
    try {                    \
      expr;                  \
    } catch (const ::mcpp::Error&) { \
    }                        \
  } while (0)
