// Data consistency (`mcpp train --check-data-consistency N`; issue 33, seed module M121): every N iterations each
// rank hashes the microbatches it trained on and the world compares the hashes.
//   - The hash of a microbatch (microbatch_hash) covers its tokens, labels and loss mask [s, b] and, with packed
//     sequences, its position ids — the whole sample as the sampler built it, *before* the context-parallel split
//     (so CP peers hash the same bytes).
//   - The tensor-, context- and pipeline-parallel peers of one sample (the members of one tp / cp / pp group) must
//     hash identically, microbatch by microbatch.
//   - The data-parallel ranks (the members of one dp group) must see disjoint samples: the sampler's sample
//     intervals [first, first + b) must not overlap, and no two members may hold byte-identical microbatches unless
//     they are the same dataset sample (a global batch larger than the dataset repeats samples legitimately).
// check_data_consistency is collective over the world (one host all_gather of a fixed-size record per rank), so every
// rank reaches the same verdict and throws the same mcpp::Error — "--check-data-consistency: iteration I: ..." naming
// the group, its global ranks, the microbatch and the ranks that differ — and the CLI ends the job.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp {
namespace parallel_state { class ParallelContext; }

// One microbatch as trained (pre-CP): its hash and the sampler's sample indices.
struct MicrobatchDigest {
  uint64_t hash = 0;
  int64_t first_sample = 0;   // the sampler's index of the microbatch's first sample (before wrapping)
  int64_t dataset_index = 0;  // the same modulo the dataset's size (the sample actually read)
};

// XXH3 over the bytes of tokens, labels, loss_mask and (when defined) position_ids.
uint64_t microbatch_hash(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                         const Tensor& position_ids);

// One rank's record: its groups (each named by its first global rank) and its microbatches of the step.
struct RankDataRecord {
  int rank = 0;
  int tp_group = 0, cp_group = 0, pp_group = 0, dp_group = 0;
  int64_t micro_batch_size = 1;
  std::vector<MicrobatchDigest> microbatches;
};

// The verdict over every rank's record (any order): "" when consistent, else the one-line diagnosis. Pure.
std::string data_consistency_verdict(int64_t iteration, const std::vector<RankDataRecord>& ranks);

// Collective over pc's world: gathers each rank's digests of `iteration` and throws the verdict (mcpp::Error) on
// every rank when it is not "".
void check_data_consistency(const parallel_state::ParallelContext& pc, int64_t iteration, int64_t micro_batch_size,
                            std::vector<MicrobatchDigest> microbatches);

}  // namespace mcpp
