// CPU vocab-parallel embedding (Megatron VocabParallelEmbedding's local lookup), fp32 table.
//
//   embedding_fwd: out[n, h] = table[ids[n] - vocab_start]  for ids in [vocab_start, vocab_start + V),
//                  a zero row otherwise (the id lives on another TP rank's partition).
//   embedding_bwd: dtable_acc[V, h] += sum over tokens t with ids[t] in the partition of dout[t]
//                  (ACCUMULATES into the main grad). Rows for out-of-partition ids are skipped.
// ids: int32, any shape with n elements (e.g. [s, b]); out/dout: n*h elements with last dim h.
// Deterministic: backward parallelises over hidden-dim blocks; each element sums tokens in order.
#include <algorithm>
#include <cstring>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
using detail::require_cpu_f32;

namespace {
struct EmbDims {
  int64_t n, v, h;
};
EmbDims embedding_dims(const char* op, const Tensor& rows, const char* rows_name, const Tensor& ids,
                       const Tensor& table, const char* table_name) {
  require_cpu_f32(op, rows_name, rows);
  require_cpu_f32(op, table_name, table);
  MCPP_CHECK(ids.defined() && ids.is_cpu() && ids.dtype() == DType::I32, "{}: ids must be a CPU int32 tensor; got {}",
             op, ids.defined() ? ids.str() : "undefined");
  MCPP_CHECK(table.ndim() == 2, "{}: {} must be 2-D [V, h]; got {}", op, table_name, table.str());
  const int64_t v = table.size(0), h = table.size(1);
  MCPP_CHECK(rows.ndim() >= 1 && rows.size(-1) == h && rows.numel() == ids.numel() * h,
             "{}: {} must be [.., h={}] with one row per id ({} ids); got {}", op, rows_name, h, ids.numel(),
             rows.str());
  return {ids.numel(), v, h};
}
}  // namespace

void embedding_fwd(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start, Stream) {
  const EmbDims d = embedding_dims("embedding_fwd", out, "out", ids, table, "table");
  const int32_t* pid = ids.data<int32_t>();
  const float* pt = table.data<float>();
  float* po = out.data<float>();
#pragma omp parallel for schedule(static) if (d.n * d.h > (1 << 16))
  for (int64_t t = 0; t < d.n; ++t) {
    const int64_t row = static_cast<int64_t>(pid[t]) - vocab_start;
    float* dst = po + t * d.h;
    if (row >= 0 && row < d.v) std::memcpy(dst, pt + row * d.h, static_cast<size_t>(d.h) * sizeof(float));
    else std::fill(dst, dst + d.h, 0.0f);
  }
}

void embedding_bwd(Tensor& dtable_acc, const Tensor& ids, const Tensor& dout, int64_t vocab_start, Stream) {
  const EmbDims d = embedding_dims("embedding_bwd", dout, "dout", ids, dtable_acc, "dtable_acc");
  const int32_t* pid = ids.data<int32_t>();
  const float* pd = dout.data<float>();
  float* pt = dtable_acc.data<float>();
  constexpr int64_t kBlock = 64;  // hidden columns per task
  const int64_t blocks = (d.h + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (d.n * d.h > (1 << 16))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(d.h, c0 + kBlock);
    for (int64_t t = 0; t < d.n; ++t) {
      const int64_t row = static_cast<int64_t>(pid[t]) - vocab_start;
      if (row < 0 || row >= d.v) continue;
      const float* src = pd + t * d.h;
      float* dst = pt + row * d.h;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace mcpp::ops::cpu
