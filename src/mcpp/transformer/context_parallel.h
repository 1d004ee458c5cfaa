// Which rows of each sample a context-parallel rank holds (Megatron's get_batch_on_this_cp_rank), and what follows
// from them: the positions of the learned position embedding and the rotary tables.
//   contiguous (--cp-comm-type a2a): rank r holds rows [r s/cp, (r+1) s/cp).
//   load-balanced (--cp-comm-type p2p): the sequence in 2 cp chunks of c = s / (2 cp) rows; rank r holds chunk r
//     then chunk 2cp-1-r. Under causal attention each rank then has the same work: the ring attention
//     (ring_attention.h) relies on this order.
#pragma once
#include <cstdint>
#include <vector>

#include "mcpp/core/tensor.h"
#include "mcpp/transformer/rope.h"

namespace mcpp {

struct CpRows {
  int64_t first = 0, count = 0;  // rows [first, first + count) of the whole sequence
};

// The row ranges of rank `rank` of `cp`, in the order the rank holds them. seq_length % cp == 0 (contiguous) or
// % (2 cp) == 0 (load-balanced), else an mcpp::Error naming the rule.
std::vector<CpRows> cp_rows(int64_t seq_length, int cp, int rank, bool load_balanced);

// This rank's rows of a tensor whose dim 0 is the whole sequence (a copy, rows in the rank's order).
Tensor cp_take_rows(const Tensor& full, const std::vector<CpRows>& rows);

// The rotary tables of this rank's rows (the whole sequence's tables' rows, in the rank's order).
RopeTables cp_rope_rows(const RopeTables& full, const std::vector<CpRows>& rows);

}  // namespace mcpp
