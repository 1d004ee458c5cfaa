#include "mcpp/transformer/context_parallel.h"

#include "mcpp/core/error.h"

namespace mcpp {

std::vector<CpRows> cp_rows(int64_t seq_length, int cp, int rank, bool load_balanced) {
  MCPP_CHECK(cp >= 1 && rank >= 0 && rank < cp, "cp_rows: rank {} of a context-parallel group of {}", rank, cp);
  if (!load_balanced || cp == 1) {
    MCPP_CHECK(seq_length % cp == 0, "sequence length {} is not divisible by context_parallel_size {}", seq_length, cp);
    const int64_t n = seq_length / cp;
    return {{rank * n, n}};
  }
  MCPP_CHECK(seq_length % (2 * cp) == 0,
             "sequence length {} is not divisible by 2 * context_parallel_size = {} (the ring attention's "
             "load-balanced chunks)", seq_length, 2 * cp);
  const int64_t c = seq_length / (2 * cp);
  return {{rank * c, c}, {(2 * cp - 1 - rank) * c, c}};
}

Tensor cp_take_rows(const Tensor& full, const std::vector<CpRows>& rows) {
  if (rows.size() == 1 && rows[0].first == 0 && rows[0].count == full.size(0)) return full;
  int64_t n = 0;
  for (const CpRows& r : rows) {
    MCPP_CHECK(r.first >= 0 && r.first + r.count <= full.size(0), "cp_take_rows: rows [{}, {}) of {}", r.first,
               r.first + r.count, full.str());
    n += r.count;
  }
  Shape shape = full.shape();
  shape[0] = n;
  Tensor out = Tensor::empty(shape, full.dtype(), full.device());
  int64_t at = 0;
  for (const CpRows& r : rows) {
    Tensor dst = out.narrow0(at, r.count);
    dst.copy_from(full.narrow0(r.first, r.count));
    at += r.count;
  }
  return out;
}

RopeTables cp_rope_rows(const RopeTables& full, const std::vector<CpRows>& rows) {
  return {cp_take_rows(full.cos, rows), cp_take_rows(full.sin, rows)};
}

}  // namespace mcpp
