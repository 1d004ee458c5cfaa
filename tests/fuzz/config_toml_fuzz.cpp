// libFuzzer target: a TOML recipe (`mcpp train --config`): load_toml_config reads the file, bounds its dotted keys
// (core/toml_limits), parses it with toml++ and overlays it onto the default Config (Config::from_json).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mcpp/training/arguments.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = mcpp::fuzz::scratch("recipe.toml");
  if (!mcpp::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size))) return 0;
  MCPP_FUZZ_CALL({
    mcpp::Config c;
    mcpp::load_toml_config(path, c);
  });
  return 0;
}
