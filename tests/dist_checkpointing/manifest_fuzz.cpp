// libFuzzer target for the checkpoint parsers an attacker or a broken disk can reach first: the
// manifest (JSON -> Manifest, with the shard-layout validation) and the safetensors container header.
// Input byte 0 picks the parser (even: manifest JSON, odd: safetensors file); the rest is the input.
// Every outcome must be a parsed value or an mcpp::Error; anything else (crash, other exception,
// sanitizer report) is a finding. Built and run by tests/dist_checkpointing/run_fuzz.sh (clang).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/manifest.h"
#include "mcpp/dist_checkpointing/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return 0;
    try {
      mcpp::dist_checkpointing::manifest_from_json(j, "fuzz/manifest.json");
    } catch (const mcpp::Error&) {
    }
    return 0;
  }
  static const std::string path = "/tmp/mcpp_fuzz_" + std::to_string(::getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(body.data(), 1, body.size(), f);
  std::fclose(f);
  try {
    mcpp::dist_checkpointing::read_safetensors_header(path);
  } catch (const mcpp::Error&) {
  }
  return 0;
}
