// MoEAlltoAllTokenDispatcher; contract in token_dispatcher.h.
#include "mcpp/moe/token_dispatcher.h"

#include "mcpp/core/error.h"

namespace mcpp::moe {
namespace {

// Copies the chunks of src laid out [a][c] (chunk (i, j) has rows[i * c + j] rows) into dst laid out [c][a].
void regroup(Tensor& dst, const Tensor& src, const std::vector<int64_t>& rows, int64_t a, int64_t c) {
  std::vector<int64_t> src_off(static_cast<size_t>(a * c) + 1, 0);
  for (size_t q = 0; q < static_cast<size_t>(a * c); ++q) src_off[q + 1] = src_off[q] + rows[q];
  int64_t out = 0;
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = 0; i < a; ++i) {
      const int64_t r = rows[static_cast<size_t>(i * c + j)];
      if (r > 0) dst.narrow0(out, r).copy_from(src.narrow0(src_off[static_cast<size_t>(i * c + j)], r));
      out += r;
    }
}

std::vector<int64_t> transposed(const std::vector<int64_t>& rows, int64_t a, int64_t c) {  // [a][c] -> [c][a]
  std::vector<int64_t> t(rows.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < c; ++j) t[static_cast<size_t>(j * a + i)] = rows[static_cast<size_t>(i * c + j)];
  return t;
}

std::vector<int64_t> times(std::vector<int64_t> v, int64_t f) {
  for (auto& x : v) x *= f;
  return v;
}

}  // namespace

MoEAlltoAllTokenDispatcher::MoEAlltoAllTokenDispatcher(int64_t num_experts, comm::CommPtr ep)
    : experts_(num_experts), ep_(std::move(ep)) {
  MCPP_CHECK(experts_ > 0 && experts_ % ep_size() == 0,
             "num_moe_experts ({}) must be a multiple of expert_model_parallel_size ({})", experts_, ep_size());
}

DispatchPlan MoEAlltoAllTokenDispatcher::plan(const Tensor& idx, const std::vector<int64_t>& counts, int64_t n,
                                              int64_t k, bool uniform) const {
  const int64_t e = experts_, ep = ep_size(), el = num_local_experts();
  MCPP_CHECK(static_cast<int64_t>(counts.size()) == e && idx.numel() == n * k,
             "dispatcher: {} counts for {} experts, idx {} for n={} k={}", counts.size(), e, idx.str(), n, k);
  DispatchPlan p;
  p.n = n;
  p.k = k;
  p.idx = idx;
  std::vector<int64_t> count = counts;
  for (const int64_t c : count) p.rows += c;

  // Every EP rank's per-expert counts ([ep, E], host all-gather; uniform: ours on every rank), then the
  // all-to-all sizes.
  Tensor mine = Tensor::from_blob(count.data(), {e}, DType::I64);
  Tensor all = Tensor::empty({ep * e}, DType::I64);
  if (ep > 1 && !uniform) {
    ep_->host().all_gather(all, mine).wait();
  } else {
    for (int64_t r = 0; r < ep; ++r) all.flat_slice(r * e, {e}).copy_from(mine);
  }
  const int64_t* ap = all.data<int64_t>();
  const int64_t me = ep_rank();
  p.send_rows.assign(static_cast<size_t>(ep), 0);
  p.recv_rows.assign(static_cast<size_t>(ep), 0);
  p.recv_chunk.assign(static_cast<size_t>(ep * el), 0);
  p.tokens_per_local_expert.assign(static_cast<size_t>(el), 0);
  for (int64_t r = 0; r < ep; ++r)
    for (int64_t j = 0; j < el; ++j) {
      p.send_rows[static_cast<size_t>(r)] += count[static_cast<size_t>(r * el + j)];
      const int64_t from_r = ap[r * e + me * el + j];
      p.recv_chunk[static_cast<size_t>(r * el + j)] = from_r;
      p.recv_rows[static_cast<size_t>(r)] += from_r;
      p.tokens_per_local_expert[static_cast<size_t>(j)] += from_r;
    }
  return p;
}

Tensor MoEAlltoAllTokenDispatcher::to_experts(const DispatchPlan& p, const Tensor& rows) const {
  if (ep_size() == 1) return rows;
  const int64_t h = rows.size(1), ep = ep_size(), el = num_local_experts();
  int64_t total = 0;
  for (const int64_t r : p.recv_rows) total += r;
  Tensor recv = Tensor::empty({total, h}, rows.dtype(), rows.device());  // [src rank][local expert]
  ep_->all_to_all(recv, rows, times(p.send_rows, h), times(p.recv_rows, h)).wait();
  Tensor grouped = Tensor::empty({total, h}, rows.dtype(), rows.device());  // [local expert][src rank]
  regroup(grouped, recv, p.recv_chunk, ep, el);
  return grouped;
}

Tensor MoEAlltoAllTokenDispatcher::from_experts(const DispatchPlan& p, const Tensor& grouped) const {
  if (ep_size() == 1) return grouped;
  const int64_t h = grouped.size(1), ep = ep_size(), el = num_local_experts();
  Tensor back = Tensor::empty(grouped.shape(), grouped.dtype(), grouped.device());  // [src rank][local expert]
  regroup(back, grouped, transposed(p.recv_chunk, ep, el), el, ep);
  Tensor rows = Tensor::empty({p.rows, h}, grouped.dtype(), grouped.device());
  ep_->all_to_all(rows, back, times(p.recv_rows, h), times(p.send_rows, h)).wait();
  return rows;
}

}  // namespace mcpp::moe
