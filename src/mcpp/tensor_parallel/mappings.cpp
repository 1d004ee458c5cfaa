#include "mcpp/tensor_parallel/mappings.h"

#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::tensor_parallel {
namespace {
constexpr int kRingTag = 4;  // P2P channel of the ring all-gather (pipeline P2P uses 0-3 on its own group)
}  // namespace

void all_reduce_tp(comm::Communicator& tp, Tensor& x) {
  if (tp.size() == 1) return;
  tp.all_reduce(x, comm::ReduceOp::Sum).wait();
}

Tensor all_gather_sp(comm::Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  Shape full = x.shape();
  full[0] *= tp.size();
  Tensor out = Tensor::empty(full, x.dtype(), x.device());  // [s, ...]
  tp.all_gather(out, x).wait();
  return out;
}

Tensor all_to_all_cp2hp(comm::Communicator& cp, const Tensor& x) {
  const int64_t c = cp.size();
  if (c == 1) return x;
  MCPP_CHECK(x.ndim() == 3 && x.size(2) % c == 0, "all_to_all_cp2hp: x {} must be [s/cp, b, cp*m] (cp={})", x.str(), c);
  const int64_t rows = x.size(0) * x.size(1), m = x.size(2) / c;
  Tensor send = Tensor::empty({c, rows, m}, x.dtype(), x.device());  // block j (for CP rank j) contiguous
  ops::chunk_transpose(send, x, rows, c);
  Tensor out = Tensor::empty({c * x.size(0), x.size(1), m}, x.dtype(), x.device());  // [s, b, m]: chunk j from j
  const std::vector<int64_t> counts(static_cast<size_t>(c), rows * m);
  cp.all_to_all(out, send, counts, counts).wait();
  return out;
}

Tensor all_to_all_hp2cp(comm::Communicator& cp, const Tensor& x) {
  const int64_t c = cp.size();
  if (c == 1) return x;
  MCPP_CHECK(x.ndim() == 3 && x.size(0) % c == 0, "all_to_all_hp2cp: x {} must be [s, b, m] with s divisible by cp={}",
             x.str(), c);
  const int64_t s_local = x.size(0) / c, rows = s_local * x.size(1), m = x.size(2);
  Tensor recv = Tensor::empty({c, rows, m}, x.dtype(), x.device());  // block j: head block j of my rows
  const std::vector<int64_t> counts(static_cast<size_t>(c), rows * m);
  cp.all_to_all(recv, x, counts, counts).wait();
  Tensor out = Tensor::empty({s_local, x.size(1), c * m}, x.dtype(), x.device());
  ops::chunk_transpose(out, recv, c, rows);
  return out;
}

Tensor reduce_scatter_sp(comm::Communicator& tp, const Tensor& x) {
  AsyncResult r = reduce_scatter_sp_async(tp, x);
  r.work.wait();
  return r.out;
}

Tensor all_gather_sp_ring(comm::Communicator& tp, const Tensor& x,
                          const std::function<void(int chunk, const Tensor& rows)>& on_chunk) {
  const int n = tp.size(), rank = tp.rank();
  if (n == 1) {
    on_chunk(0, x);
    return x;
  }
  Shape full = x.shape();
  full[0] *= n;
  Tensor out = Tensor::empty(full, x.dtype(), x.device());  // [s, ...]
  auto chunk = [&](int c) { return out.narrow0(c * x.size(0), x.size(0)); };
  chunk(rank).copy_from(x);
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  int cur = rank;
  for (int k = 0; k < n; ++k) {
    const int incoming = (cur + n - 1) % n;  // what the previous rank holds at this step
    comm::Work work;
    if (k + 1 < n)
      work = tp.batch_p2p({{comm::P2POp::Kind::Send, chunk(cur), next, kRingTag},
                           {comm::P2POp::Kind::Recv, chunk(incoming), prev, kRingTag}});
    on_chunk(cur, chunk(cur));  // overlaps the transfer (on GPUs: compute stream beside the comm stream)
    work.wait();
    cur = incoming;
  }
  return out;
}

Tensor reduce_scatter_sp_ring(comm::Communicator& tp, const Shape& chunk_shape, DType dtype, Device device,
                              const std::function<void(int chunk, Tensor& out)>& partial) {
  const int n = tp.size(), rank = tp.rank();
  if (n == 1) {
    Tensor out = Tensor::empty(chunk_shape, dtype, device);
    partial(0, out);
    return out;
  }
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  // Two running sums (one travels while the next is computed) and the receive buffer.
  Tensor sums[2] = {Tensor::empty(chunk_shape, dtype, device), Tensor::empty(chunk_shape, dtype, device)};
  Tensor received = Tensor::empty(chunk_shape, dtype, device);
  comm::Work in_flight;
  for (int k = 0;; ++k) {
    Tensor& mine = sums[k % 2];
    partial((rank - k - 1 + 2 * n) % n, mine);  // overlaps the previous step's transfer
    if (k > 0) {
      in_flight.wait();
      ops::add_inplace(mine, received);  // the previous ranks' sum of this chunk
    }
    if (k == n - 1) return mine;  // chunk `rank`, summed over every rank
    in_flight = tp.batch_p2p({{comm::P2POp::Kind::Send, mine, next, kRingTag},
                              {comm::P2POp::Kind::Recv, received, prev, kRingTag}});
  }
}

AsyncResult all_reduce_tp_async(comm::Communicator& tp, Tensor& x) {
  if (tp.size() == 1) return {x, comm::Work()};
  return {x, tp.all_reduce(x, comm::ReduceOp::Sum)};
}

AsyncResult reduce_scatter_sp_async(comm::Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return {x, comm::Work()};
  Shape part = x.shape();
  MCPP_CHECK(part[0] % tp.size() == 0, "sequence-parallel reduce-scatter: dim 0 of {} not divisible by tp={}",
             x.str(), tp.size());
  part[0] /= tp.size();
  Tensor out = Tensor::empty(part, x.dtype(), x.device());  // [s/tp, ...]
  comm::Work work = tp.reduce_scatter(out, x, comm::ReduceOp::Sum);
  return {out, std::move(work)};
}

Tensor all_gather_last_dim(comm::Communicator& tp, const Tensor& x) {
  const int t = tp.size();
  if (t == 1) return x;
  const int64_t w = x.size(x.ndim() - 1), n = x.numel() / w;
  Tensor all = Tensor::empty({t * n, w}, x.dtype(), x.device());  // [tp, n, w]: rank-major
  tp.all_gather(all, x.view({n, w})).wait();
  Shape full = x.shape();
  full.back() *= t;
  Tensor out = Tensor::empty(full, x.dtype(), x.device());
  ops::chunk_transpose(out, all, t, n);  // [n, tp, w] = [n, tp * w]
  return out;
}

Tensor split_last_dim(comm::Communicator& tp, const Tensor& x) {
  const int t = tp.size();
  if (t == 1) return x;
  const int64_t full = x.size(x.ndim() - 1), n = x.numel() / full;
  MCPP_CHECK(full % t == 0, "split_last_dim: last dim {} not divisible by tp={}", full, t);
  const int64_t w = full / t;
  Tensor blocks = Tensor::empty({t * n, w}, x.dtype(), x.device());
  ops::chunk_transpose(blocks, x, n, t);  // [n, tp, w] -> [tp, n, w]
  Shape local = x.shape();
  local.back() = w;
  return blocks.narrow0(tp.rank() * n, n).view(local);
}

Tensor split_sp(comm::Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  const int64_t s = x.size(0);
  MCPP_CHECK(s % tp.size() == 0, "sequence parallel: sequence length {} not divisible by tp={}", s, tp.size());
  const int64_t chunk = s / tp.size();
  return x.narrow0(tp.rank() * chunk, chunk);
}

}  // namespace mcpp::tensor_parallel
