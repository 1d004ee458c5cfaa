// CUDA vocab-parallel embedding (Megatron VocabParallelEmbedding's local lookup), embedding_kernels.cu.
//   embedding_fwd: out[n, h] = table[ids[n] - vocab_start] for ids in [vocab_start, vocab_start + V), zero
//                  rows otherwise. table/out: float32 or bf16 (may differ; rounded on store).
//   embedding_bwd: dtable_acc[V, h] += dout rows of in-partition ids (ACCUMULATES; float32 main grad).
//                  Default: atomicAdd, the order of tokens sharing an id is unspecified. With
//                  deterministic_kernels() (--deterministic-mode): each vocabulary row belongs to one block,
//                  which adds its tokens in position order — bitwise the CPU backend's result.
// ids: int32, n elements (any shape); out/dout: [.., h] with one row per id. Async on stream_of(stream).
#include <atomic>

#include "mcpp/kernels/cuda/cuda_check.h"
#include "mcpp/kernels/deterministic_kernels.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cuda {
using namespace cuda_detail;

namespace {
std::atomic<bool> g_deterministic{false};

void check_rows(const char* op, const Tensor& rows, const char* rows_name, const Tensor& ids, const Tensor& table,
                const char* table_name) {
  require_i32(op, "ids", ids);
  MCPP_CHECK(table.ndim() == 2, "{}: {} must be 2-D [V, h]; got {}", op, table_name, table.str());
  const int64_t h = table.size(1);
  MCPP_CHECK(rows.ndim() >= 1 && rows.size(-1) == h && rows.numel() == ids.numel() * h,
             "{}: {} must be [.., h={}] with one row per id ({} ids); got {}", op, rows_name, h, ids.numel(),
             rows.str());
}
}  // namespace

void embedding_fwd(Tensor& out, const Tensor& ids, const Tensor& table, int64_t vocab_start, Stream stream) {
  const FOut o = fout_of("embedding_fwd", "out", out);
  const FIn t = fin_of("embedding_fwd", "table", table);
  check_rows("embedding_fwd", out, "out", ids, table, "table");
  launch_embedding_fwd(o, ids.data<int32_t>(), t, ids.numel(), table.size(0), table.size(1), vocab_start,
                       stream_of(stream));
}

void embedding_bwd(Tensor& dtable_acc, const Tensor& ids, const Tensor& dout, int64_t vocab_start, Stream stream) {
  require_float("embedding_bwd", "dtable_acc", dtable_acc, /*bf16_ok=*/false);
  const FIn d = fin_of("embedding_bwd", "dout", dout);
  check_rows("embedding_bwd", dout, "dout", ids, dtable_acc, "dtable_acc");
  launch_embedding_bwd(dtable_acc.data<float>(), ids.data<int32_t>(), d, ids.numel(), dtable_acc.size(0),
                       dtable_acc.size(1), vocab_start, g_deterministic.load(), stream_of(stream));
}

void set_deterministic_kernels(bool on) { g_deterministic.store(on); }
bool deterministic_kernels() { return g_deterministic.load(); }

}  // namespace mcpp::ops::cuda
