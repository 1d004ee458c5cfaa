// libFuzzer target: the config JSON a checkpoint's meta.config holds (parse_json_limited -> Config::from_json ->
// finalize -> validate), as `mcpp forward` / `generate` / `ckpt verify` read it.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mcpp/core/json_limits.h"
#include "mcpp/training/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  MCPP_FUZZ_CALL({
    mcpp::Config c = mcpp::Config::from_json(mcpp::parse_json_limited(text, "fuzz/config.json"));
    c.finalize();
    c.validate();
  });
  return 0;
}
