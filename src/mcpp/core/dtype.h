// DType and Device tags, bf16/fp16 <-> fp32 conversion (round-to-nearest-even).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mcpp {

enum class DType : uint8_t { F32, BF16, F16, I32, I64 };
enum class Device : uint8_t { CPU, CUDA };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}
std::string_view dtype_name(DType t);          // "float32", "bfloat16", ...
std::string_view dtype_safetensors_name(DType t);  // "F32", "BF16", "F16", "I32", "I64"
DType dtype_from_name(std::string_view name);  // accepts both spellings; throws mcpp::Error
std::string_view device_name(Device d);

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace mcpp
