// numpy.random.RandomState(seed).shuffle(x), bit for bit, for 1-D arrays.
//
// Megatron's GPTDataset shuffles its document and sample indices with numpy.random.RandomState(seed).
// That legacy generator is MT19937 seeded by init_genrand(seed) — exactly std::mt19937(seed) — and
// shuffle() is Fisher-Yates from the back, drawing j in [0, i] by masked rejection sampling
// (numpy's random_interval: 32-bit draws while i <= 0xffffffff, else 64-bit draws made of two
// 32-bit outputs, high word first). Reproducing it makes our document/sample/shuffle indices equal
// Megatron's for the same seed; tests/datasets/gpt_dataset_test.cpp checks it against numpy.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace mcpp {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  // A uniform integer in [0, max] (numpy's random_interval).
  uint64_t interval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t v;
    if (max <= 0xffffffffULL) {
      do v = static_cast<uint64_t>(mt_()) & mask;
      while (v > max);
    } else {
      do {
        const uint64_t hi = mt_(), lo = mt_();
        v = ((hi << 32) | lo) & mask;
      } while (v > max);
    }
    return v;
  }

  template <typename T>
  void shuffle(std::span<T> x) {
    for (size_t i = x.size() > 0 ? x.size() - 1 : 0; i >= 1; --i) {
      const auto j = static_cast<size_t>(interval(i));
      std::swap(x[i], x[j]);
    }
  }

 private:
  std::mt19937 mt_;
};

}  // namespace mcpp
