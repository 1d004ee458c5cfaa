#include "mcpp/tensor_parallel/mappings.h"

#include "mcpp/core/error.h"

namespace mcpp::tensor_parallel {

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

Tensor reduce_scatter_sp(comm::Communicator& tp, const Tensor& x) {
  AsyncResult r = reduce_scatter_sp_async(tp, x);
  r.work.wait();
  return r.out;
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

Tensor split_sp(comm::Communicator& tp, const Tensor& x) {
  if (tp.size() == 1) return x;
  const int64_t s = x.size(0);
  MCPP_CHECK(s % tp.size() == 0, "sequence parallel: sequence length {} not divisible by tp={}", s, tp.size());
  const int64_t chunk = s / tp.size();
  return x.narrow0(tp.rank() * chunk, chunk);
}

}  // namespace mcpp::tensor_parallel
