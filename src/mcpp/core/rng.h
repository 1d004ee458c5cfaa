// Counter-based RNG (Philox-4x32-10, Salmon et al. 2011 — the generator cuRAND and PyTorch's CUDA
// dropout use). A (seed, offset) pair names a stream; element i of a draw uses counter offset + i, so a
// CPU and a CUDA kernel produce the same numbers, and a recompute replays the same dropout mask by
// reusing the key. RngState tracks the next offset for a named stream (the model-parallel tracker in
// tensor_parallel/random.h holds several).
#pragma once
#include <array>
#include <cstdint>

namespace mcpp {

struct PhiloxKey {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in units of 4 x uint32 draws
  // CUDA-graph-safe keys (RngTracker::begin_graph_capture): a device uint64 the CUDA kernels add to
  // offset when they run, so a replayed graph draws the current step's numbers. nullptr: offset is
  // absolute (always on the CPU backend, which refuses a key with a device base).
  const uint64_t* device_base = nullptr;
};

inline std::array<uint32_t, 4> philox4x32_10(uint64_t seed, uint64_t counter_lo, uint64_t counter_hi) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// Uniform in [0, 1) from 24 random bits (exact in fp32).
inline float philox_uniform(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// Element i of the stream named by key: uniform in [0, 1).
inline float philox_uniform_at(const PhiloxKey& key, uint64_t i) {
  auto r = philox4x32_10(key.seed, key.offset + i / 4, 0);
  return philox_uniform(r[i % 4]);
}

// A named stream position: draw(n) returns the key for the next n elements and advances. With a device
// base (CUDA graphs) the key's offset is relative to graph_origin, the offset the base held at capture.
struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint64_t graph_origin = 0;
  const uint64_t* device_base = nullptr;
  PhiloxKey draw(uint64_t n) {
    PhiloxKey k{seed, offset - graph_origin, device_base};
    offset += (n + 3) / 4;
    return k;
  }
};

}  // namespace mcpp
