// libFuzzer target: the checkpoint manifest (JSON text -> parse_json_limited -> manifest_from_json, with the
// checksum, shard-layout and aliasing checks). Byte 0 even: the text as is (the checksum check is what most inputs
// reach); odd: the parsed JSON re-sealed first (seal_manifest), so the fuzzer also drives the layout validation
// behind a consistent checksum. Every outcome must be a Manifest or an mcpp::Error.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mcpp/core/json_limits.h"
#include "mcpp/dist_checkpointing/manifest.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  MCPP_FUZZ_CALL({
    nlohmann::json j = mcpp::parse_json_limited(text, "fuzz/manifest.json");
    if (data[0] % 2 == 1 && j.is_object()) mcpp::dist_checkpointing::seal_manifest(j);
    mcpp::dist_checkpointing::manifest_from_json(j, "fuzz/manifest.json");
  });
  return 0;
}
