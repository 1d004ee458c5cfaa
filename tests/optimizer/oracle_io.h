// Helpers for the optimizer tests that run a PyTorch / Python oracle (tests/oracle/optimizer/*.py)
// through oracle_python() (/usr/bin/python3 by default) and exchange float32 arrays and JSON through a fresh
// temp directory.
#pragma once
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/oracle/oracle_python.h"

namespace mcpp::test {

inline std::filesystem::path fresh_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  auto d = std::filesystem::temp_directory_path() /
           ("mcpp_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline void write_f32(const std::filesystem::path& p, const std::vector<float>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

inline std::vector<float> read_f32(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("oracle output missing: " + p.string());
  std::vector<float> v(static_cast<size_t>(f.tellg()) / sizeof(float));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

inline void write_json(const std::filesystem::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(); }
inline nlohmann::json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("oracle output missing: " + p.string());
  return nlohmann::json::parse(f);
}

// Runs oracle_python() <MCPP_SOURCE_DIR>/tests/oracle/optimizer/<script> <args>; returns the exit code.
inline int run_oracle(const std::string& script, const std::string& args) {
  std::string cmd = oracle_python() + std::string(MCPP_SOURCE_DIR) + "/tests/oracle/optimizer/" + script + " " + args;
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Deterministic pseudo-random floats in [-scale, scale) (an LCG; no dependence on <random> versions).
inline std::vector<float> lcg_fill(size_t n, uint64_t seed, float scale) {
  std::vector<float> v(n);
  uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (auto& x : v) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    x = scale * (static_cast<float>((s >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f);
  }
  return v;
}

}  // namespace mcpp::test
