// MoEAlltoAllTokenDispatcher; contract in token_dispatcher.h.
#include "mcpp/transformer/moe/token_dispatcher.h"

#include <algorithm>
#include <numeric>

#include "mcpp/core/error.h"

namespace mcpp::moe {
namespace {

struct Chunk {
  int64_t gathered = 0, grouped = 0, rows = 0;  // row offsets in the two layouts
};

// Where each (expert-TP rank q, EP rank r, local expert j) chunk sits in the gathered buffer ([q] blocks of
// `block` rows, each [r][j] packed) and in the grouped one ([j][q][r] packed).
std::vector<Chunk> chunks(const DispatchPlan& p, int64_t etp, int64_t ep, int64_t el, int64_t block) {
  std::vector<Chunk> out(static_cast<size_t>(etp * ep * el));
  for (int64_t q = 0; q < etp; ++q) {
    int64_t off = q * block;
    for (int64_t i = q * ep * el; i < (q + 1) * ep * el; ++i) {
      out[static_cast<size_t>(i)] = {.gathered = off, .rows = p.recv_chunk[static_cast<size_t>(i)]};
      off += out[static_cast<size_t>(i)].rows;
    }
  }
  int64_t off = 0;
  for (int64_t j = 0; j < el; ++j)
    for (int64_t i = j; i < etp * ep * el; i += el) {
      out[static_cast<size_t>(i)].grouped = off;
      off += out[static_cast<size_t>(i)].rows;
    }
  return out;
}

std::vector<int64_t> times(std::vector<int64_t> v, int64_t f) {
  for (auto& x : v) x *= f;
  return v;
}

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

}  // namespace

MoEAlltoAllTokenDispatcher::MoEAlltoAllTokenDispatcher(int64_t num_experts, comm::CommPtr ep, comm::CommPtr etp)
    : experts_(num_experts), ep_(std::move(ep)), etp_(std::move(etp)) {
  MCPP_CHECK(experts_ > 0 && experts_ % ep_size() == 0,
             "num_moe_experts ({}) must be a multiple of expert_model_parallel_size ({})", experts_, ep_size());
}

DispatchPlan MoEAlltoAllTokenDispatcher::plan(const Tensor& idx, const std::vector<int64_t>& counts, int64_t n,
                                              int64_t k, bool uniform) const {
  const int64_t e = experts_, ep = ep_size(), etp = etp_size(), el = num_local_experts();
  MCPP_CHECK(static_cast<int64_t>(counts.size()) == e && idx.numel() == n * k,
             "dispatcher: {} counts for {} experts, idx {} for n={} k={}", counts.size(), e, idx.str(), n, k);
  DispatchPlan p;
  p.n = n;
  p.k = k;
  p.idx = idx;
  std::vector<int64_t> count = counts;
  p.rows = sum(count);

  // Every rank's per-expert counts [etp][ep][E]: host all-gathers over EP, then over expert-TP (the expert-TP
  // peers' EP groups line up rank for rank); uniform: ours everywhere.
  Tensor mine = Tensor::from_blob(count.data(), {e}, DType::I64);
  Tensor ep_all = Tensor::empty({ep * e}, DType::I64), all = Tensor::empty({etp * ep * e}, DType::I64);
  if (ep > 1 && !uniform) ep_->host().all_gather(ep_all, mine).wait();
  else
    for (int64_t r = 0; r < ep; ++r) ep_all.flat_slice(r * e, {e}).copy_from(mine);
  if (etp > 1 && !uniform) etp_->host().all_gather(all, ep_all).wait();
  else
    for (int64_t q = 0; q < etp; ++q) all.flat_slice(q * ep * e, {ep * e}).copy_from(ep_all);
  const int64_t* ap = all.data<int64_t>();
  const int64_t me = ep_rank(), q_me = etp_rank();
  p.send_rows.assign(static_cast<size_t>(ep), 0);
  p.recv_rows.assign(static_cast<size_t>(ep), 0);
  p.etp_rows.assign(static_cast<size_t>(etp), 0);
  p.recv_chunk.assign(static_cast<size_t>(etp * ep * el), 0);
  p.tokens_per_local_expert.assign(static_cast<size_t>(el), 0);
  for (int64_t r = 0; r < ep; ++r)
    for (int64_t j = 0; j < el; ++j) p.send_rows[static_cast<size_t>(r)] += count[static_cast<size_t>(r * el + j)];
  for (int64_t q = 0; q < etp; ++q)
    for (int64_t r = 0; r < ep; ++r)
      for (int64_t j = 0; j < el; ++j) {
        const int64_t c = ap[(q * ep + r) * e + me * el + j];
        p.recv_chunk[static_cast<size_t>((q * ep + r) * el + j)] = c;
        p.etp_rows[static_cast<size_t>(q)] += c;
        p.tokens_per_local_expert[static_cast<size_t>(j)] += c;
        if (q == q_me) p.recv_rows[static_cast<size_t>(r)] += c;
      }
  return p;
}

DispatchPlan MoEAlltoAllTokenDispatcher::plan_local(const Tensor& idx, int64_t n, int64_t k) const {
  MCPP_CHECK(ep_size() == 1 && etp_size() == 1 && idx.numel() == n * k,
             "dispatcher: a local plan needs EP 1 and expert-TP 1 (got {} and {}) and idx [n={}, k={}]; got {}",
             ep_size(), etp_size(), n, k, idx.str());
  DispatchPlan p;
  p.n = n;
  p.k = k;
  p.rows = n * k;
  p.idx = idx;
  p.send_rows = p.recv_rows = p.etp_rows = {p.rows};
  return p;
}

Tensor MoEAlltoAllTokenDispatcher::to_experts(const DispatchPlan& p, const Tensor& rows) const {
  const int64_t ep = ep_size(), etp = etp_size(), el = num_local_experts();
  if (ep == 1 && etp == 1) return rows;
  const int64_t h = rows.size(1);
  // This rank's rows [EP rank][local expert], received over EP straight into the block the expert-TP all-gather
  // sends (padded to the largest block: its padding rows are never read).
  const int64_t mine = sum(p.recv_rows), block = *std::max_element(p.etp_rows.begin(), p.etp_rows.end());
  Tensor recv = rows;
  if (ep > 1 || (etp > 1 && mine != block)) {
    recv = Tensor::empty({etp > 1 ? block : mine, h}, rows.dtype(), rows.device());
    Tensor dst = recv.narrow0(0, mine);
    if (ep > 1) ep_->all_to_all(dst, rows, times(p.send_rows, h), times(p.recv_rows, h)).wait();
    else if (mine > 0) dst.copy_from(rows);
  }
  Tensor gathered = recv;  // [etp rank: block of `block` rows][EP rank][local expert]
  if (etp > 1) {
    gathered = Tensor::empty({etp * block, h}, rows.dtype(), rows.device());
    etp_->all_gather(gathered, recv).wait();
  }
  Tensor grouped = Tensor::empty({sum(p.tokens_per_local_expert), h}, rows.dtype(), rows.device());
  for (const Chunk& c : chunks(p, etp, ep, el, block))
    if (c.rows > 0) grouped.narrow0(c.grouped, c.rows).copy_from(gathered.narrow0(c.gathered, c.rows));
  return grouped;
}

Tensor MoEAlltoAllTokenDispatcher::from_experts(const DispatchPlan& p, const Tensor& grouped) const {
  const int64_t ep = ep_size(), etp = etp_size(), el = num_local_experts();
  if (ep == 1 && etp == 1) return grouped;
  const int64_t h = grouped.size(1);
  const int64_t block = *std::max_element(p.etp_rows.begin(), p.etp_rows.end());
  Tensor back = Tensor::empty({etp * block, h}, grouped.dtype(), grouped.device());  // [etp][EP rank][expert]
  for (int64_t q = 0; q < etp; ++q) {  // padding rows zero: the reduce-scatter sums them into rows dropped below
    const int64_t used = p.etp_rows[static_cast<size_t>(q)];
    if (used < block) back.narrow0(q * block + used, block - used).zero_();
  }
  for (const Chunk& c : chunks(p, etp, ep, el, block))
    if (c.rows > 0) back.narrow0(c.gathered, c.rows).copy_from(grouped.narrow0(c.grouped, c.rows));
  Tensor mine = back;  // this expert-TP rank's rows, the experts' partial outputs summed
  if (etp > 1) {
    Tensor reduced = Tensor::empty({block, h}, grouped.dtype(), grouped.device());
    etp_->reduce_scatter(reduced, back, comm::ReduceOp::Sum).wait();
    mine = reduced.narrow0(0, p.etp_rows[static_cast<size_t>(etp_rank())]);
  }
  if (ep == 1) return mine;
  Tensor out = Tensor::empty({p.rows, h}, grouped.dtype(), grouped.device());
  ep_->all_to_all(out, mine, times(p.recv_rows, h), times(p.send_rows, h)).wait();
  return out;
}

}  // namespace mcpp::moe
