#include "mcpp/core/dtype.h"

#include <cmath>

#include "mcpp/core/error.h"

namespace mcpp {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "?";
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

DType dtype_from_name(std::string_view n) {
  if (n == "float32" || n == "F32" || n == "fp32") return DType::F32;
  if (n == "bfloat16" || n == "BF16" || n == "bf16") return DType::BF16;
  if (n == "float16" || n == "F16" || n == "fp16") return DType::F16;
  if (n == "int32" || n == "I32") return DType::I32;
  if (n == "int64" || n == "I64") return DType::I64;
  fail("unknown dtype '{}'", n);
}

std::string_view device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x007fffffu;
  int exp = static_cast<int>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {                                                 // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x00800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: correct
  return static_cast<uint16_t>(half);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(mant), -24);
    if (sign) out = -out;
    return out;
  }
  uint32_t x;
  if (exp == 0x1f) x = sign | 0x7f800000u | (mant << 13);
  else x = sign | (static_cast<uint32_t>(exp - 15 + 127) << 23) | (mant << 13);
  std::memcpy(&out, &x, 4);
  return out;
}

}  // namespace mcpp
