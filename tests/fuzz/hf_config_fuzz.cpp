// libFuzzer target: a HuggingFace model directory's config.json (`mcpp ckpt import`): byte 0 picks the format
// (gpt2, llama, mixtral, qwen2, qwen2-moe, qwen3, qwen3-moe,
// deepseek-v2, deepseek-v3), the rest is config.json. The directory also holds an
// empty model.safetensors, so an accepted config proceeds to the tensor import (which then names a missing tensor).
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

#include "mcpp/dist_checkpointing/hf_convert.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using mcpp::dist_checkpointing::HfFormat;
  if (size == 0) return 0;
  static const std::string dir = [] {
    const std::string d = mcpp::fuzz::scratch("hf");
    std::filesystem::create_directories(d);
    const std::string empty_header = "{}      ";  // 8 bytes: a header with no tensors
    std::string st(8, '\0');
    st[0] = static_cast<char>(empty_header.size());
    mcpp::fuzz::write_file(d + "/model.safetensors", st + empty_header);
    return d;
  }();
  static const HfFormat kFormats[] = {HfFormat::Gpt2,  HfFormat::Llama,    HfFormat::Mixtral, HfFormat::Qwen2,
                                      HfFormat::Qwen2Moe, HfFormat::Qwen3, HfFormat::Qwen3Moe, HfFormat::DeepseekV2,
                                      HfFormat::DeepseekV3};
  if (!mcpp::fuzz::write_file(dir + "/config.json", std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1)))
    return 0;
  MCPP_FUZZ_CALL(mcpp::dist_checkpointing::import_hf(dir, kFormats[data[0] % std::size(kFormats)]));
  return 0;
}
