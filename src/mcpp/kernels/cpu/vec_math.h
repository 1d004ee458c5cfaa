// Vectorizable float math shared by the CPU kernels (kernels/cpu/*.cpp): scalar inline functions with no
// libm call, no branch and no float compare, so a plain loop over them auto-vectorizes under our flags
// (-O3, GCC's default -ftrapping-math, no -ffast-math). Users: attention.cpp (tile softmax),
// cross_entropy.cpp (logsumexp and softmax over the vocabulary).
#pragma once
#include <bit>
#include <cstdint>

// MCPP_VEC_CLONES on a hot loop function: GCC compiles it for AVX-512, AVX2 and the baseline
// (-march=x86-64-v2 = SSE4.2) and picks one at load time by the CPU (ifunc), so the portable binary still
// runs 16-wide where the hardware allows. The lanes and summation order are fixed by the source, so a
// given machine always gets the same bits; across CPUs results may differ in the last bit (FMA contraction).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MCPP_VEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MCPP_VEC_CLONES
#endif

namespace mcpp::ops::cpu::detail {

// exp(x) for float32 written so loops over it vectorize (std::exp does not without -ffast-math): Cephes'
// expf — x = n ln2 + r with |r| <= ln2/2, degree-7 polynomial for e^r, 2^n through the exponent bits.
// Within 1 ulp (8e-8 relative) of exp on [-87, 0]; x < -87 (including the mask's -inf) gives exactly 0.
// Domain: x <= 88 (every caller passes scores minus their row max or lse, i.e. x <= ~0). No float
// compare or min/max: under GCC's default -ftrapping-math those stop the loop from vectorizing.
inline float exp_approx(float x) {
  // round(x / ln2) by the 1.5 * 2^23 shifter (round-to-nearest, no libm call, no branch)
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  // x < -87 tested on the bits (negative floats order as unsigned ints, reversed); it also zeroes the
  // NaN that x = -inf produces above.
  constexpr uint32_t kMinusBits = std::bit_cast<uint32_t>(-87.0f);
  const uint32_t keep = 0u - static_cast<uint32_t>(std::bit_cast<uint32_t>(x) <= kMinusBits);  // all 1s or 0
  return std::bit_cast<float>(std::bit_cast<uint32_t>(er * two_n) & keep);
}

}  // namespace mcpp::ops::cpu::detail
