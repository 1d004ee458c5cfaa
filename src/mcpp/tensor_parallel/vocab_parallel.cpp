#include "mcpp/tensor_parallel/vocab_parallel.h"

#include <cmath>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/tensor_parallel/layers.h"
#include "mcpp/tensor_parallel/mappings.h"

namespace mcpp::tensor_parallel {

VocabParallelEmbedding::VocabParallelEmbedding(ParameterRegistry& params, const std::string& key,
                                               int64_t padded_vocab, int64_t hidden, float init_std,
                                               comm::CommPtr tp)
    : tp_(std::move(tp)), hidden_(hidden) {
  const int t = tp_->size();
  MCPP_CHECK(padded_vocab % t == 0, "padded vocabulary {} not divisible by tp={}", padded_vocab, t);
  const int64_t local = padded_vocab / t;
  vocab_start_ = tp_->rank() * local;
  weight_ = params.add({.key = key,
                        .shape = {local, hidden},
                        .init = InitKind::Normal,
                        .std = init_std,
                        .shard = tp_shard({padded_vocab, hidden}, 0, t, tp_->rank())});
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) const {
  Tensor out = Tensor::empty({ids.numel(), hidden_}, weight_->data.dtype(), weight_->data.device());  // [n, h]
  ops::embedding_fwd(out, ids, weight_->data, vocab_start_);
  all_reduce_tp(*tp_, out);  // reduce_from_tp
  return out;
}

void VocabParallelEmbedding::backward(const Tensor& ids, const Tensor& dout) const {
  materialize_grads({weight_});  // a scatter-add (a tied output layer's backward may have written it already)
  ops::embedding_bwd(weight_->main_grad, ids, dout, vocab_start_);
}

void vocab_parallel_cross_entropy_fwd(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                                      int64_t vocab_start, comm::Communicator& tp) {
  if (tp.size() == 1) {
    ops::cross_entropy_fwd(loss, lse, logits, targets);
    return;
  }
  const int64_t n = logits.size(0);
  const Device dev = logits.device();
  Tensor mx = Tensor::empty({n}, DType::F32, dev), se = Tensor::empty({n}, DType::F32, dev),
         tl = Tensor::empty({n}, DType::F32, dev);
  ops::vocab_parallel_ce_partials(mx, se, tl, logits, targets, vocab_start);
  // Megatron's combine, on the logits' device (NCCL on GPUs: no host round trip, capturable in a CUDA graph).
  Tensor local_lse = Tensor::empty({n}, DType::F32, dev);
  ops::vocab_parallel_ce_local_lse(local_lse, mx, se);  // this slice's logsumexp
  Tensor gmax = local_lse.clone();
  tp.all_reduce(gmax, comm::ReduceOp::Max).wait();
  Tensor scaled = Tensor::empty({n}, DType::F32, dev);
  ops::vocab_parallel_ce_rescale(scaled, local_lse, gmax);
  tp.all_reduce(scaled, comm::ReduceOp::Sum).wait();
  tp.all_reduce(tl, comm::ReduceOp::Sum).wait();
  ops::vocab_parallel_ce_finish(loss, lse, gmax, scaled, tl);
}

void vocab_parallel_cross_entropy_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                                      const Tensor& targets, const Tensor& lse, int64_t vocab_start,
                                      comm::Communicator& tp) {
  if (tp.size() == 1) ops::cross_entropy_bwd(dlogits, dloss, logits, targets, lse);
  else ops::vocab_parallel_ce_bwd(dlogits, dloss, logits, targets, lse, vocab_start);
}

}  // namespace mcpp::tensor_parallel
