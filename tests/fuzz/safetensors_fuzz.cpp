// libFuzzer target: the safetensors container header (u64 length, JSON header, data section) as read from a file
// by read_safetensors_header, then every entry it accepts read back (read_safetensors_tensor, for our dtypes).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mcpp/dist_checkpointing/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = mcpp::fuzz::scratch("x.safetensors");
  if (!mcpp::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size))) return 0;
  MCPP_FUZZ_CALL({
    const auto h = mcpp::dist_checkpointing::read_safetensors_header(path);
    for (const auto& e : h.entries)
      if (e.dtype_known) mcpp::dist_checkpointing::read_safetensors_tensor(h, e);
  });
  return 0;
}
