// Model-parallel RNG tracker (Megatron-Core tensor_parallel/random.py: CudaRNGStatesTracker +
// model_parallel_cuda_manual_seed), over our counter-based Philox streams (core/rng.h).
//   default stream:        seed' = seed + 100 * pp_rank          — identical on the ranks of a TP group, so
//                          dropout on replicated activations is identical where the data is replicated.
//   model-parallel stream: seed' + 2718 + tp_rank                — differs per TP rank, for dropout on
//                          TP-sharded data (attention probabilities of local heads; sequence-parallel
//                          activation shards).
// A draw of n elements returns a PhiloxKey and advances that stream; the key is saved in the module context
// so backward and recompute replay the same mask. The state (seed, offset per stream) is checkpointed.
#pragma once
#include <array>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "mcpp/core/rng.h"

namespace mcpp::tensor_parallel {

class RngTracker {
 public:
  RngTracker() = default;
  RngTracker(uint64_t seed, int tp_rank, int pp_rank)
      : default_{seed + 100 * static_cast<uint64_t>(pp_rank), 0},
        model_parallel_{seed + 100 * static_cast<uint64_t>(pp_rank) + 2718 + static_cast<uint64_t>(tp_rank), 0} {}

  PhiloxKey draw_default(uint64_t n) { return default_.draw(n); }
  PhiloxKey draw_model_parallel(uint64_t n) { return model_parallel_.draw(n); }
  // Sharded data (sequence parallel) draws from the model-parallel stream, replicated data from default.
  PhiloxKey draw(uint64_t n, bool sharded) { return sharded ? draw_model_parallel(n) : draw_default(n); }

  // Offsets only: seeds follow from --seed and the rank, so a state saved at one parallel layout
  // restores at another (every rank draws the same number of elements).
  nlohmann::json state() const {
    return {{"default_offset", default_.offset}, {"model_parallel_offset", model_parallel_.offset}};
  }
  void load_state(const nlohmann::json& j) {
    default_.offset = j.at("default_offset").get<uint64_t>();
    model_parallel_.offset = j.at("model_parallel_offset").get<uint64_t>();
  }

  // CUDA graphs (Megatron's graph-safe RNG tracker): from the captured step on, keys are relative to the
  // offsets at its start and carry device_slots[0] (default) / [1] (model-parallel), device uint64s that
  // must hold each stream's offset at the start of the step being run (the trainer writes offsets() there
  // before every replay, then advance()s by what one step draws, as the host code no longer runs).
  void begin_graph_capture(const uint64_t* device_slots) {
    default_.graph_origin = default_.offset;
    default_.device_base = device_slots;
    model_parallel_.graph_origin = model_parallel_.offset;
    model_parallel_.device_base = device_slots + 1;
  }
  std::array<uint64_t, 2> offsets() const { return {default_.offset, model_parallel_.offset}; }
  void advance(const std::array<uint64_t, 2>& by) {
    default_.offset += by[0];
    model_parallel_.offset += by[1];
  }

 private:
  RngState default_;
  RngState model_parallel_;
};

}  // namespace mcpp::tensor_parallel
