// Vocabulary-parallel embedding and cross entropy (Megatron-Core tensor_parallel/layers.py
// VocabParallelEmbedding and cross_entropy.py _VocabParallelCrossEntropy).
//
// VocabParallelEmbedding: W_r [Vp/tp, h] holds ids [vocab_start, vocab_start + Vp/tp).
//   fwd: out [n, h] = rows of W_r for ids in the slice, 0 otherwise -> all-reduce over TP (reduce_from_tp).
//   bwd: dW_r += scatter-add of dout for ids in the slice (the all-reduce's backward is the identity).
// vocab_parallel_cross_entropy: logits [n, Vp/tp] (this rank's slice), targets int32 [n] (global ids).
//   fwd: per row, local max / sum-exp / target logit (ops::vocab_parallel_ce_partials), combined over TP:
//        lse = logsumexp over ranks of (max_r + log sum_r) (all-reduce MAX, then SUM), target logit by
//        all-reduce SUM; loss = lse - target_logit (float32). tp == 1 runs the fused single-pass kernel.
//   bwd: dlogits = (softmax - onehot in the slice) * dloss (no communication).
#pragma once
#include <string>

#include "mcpp/comm/communicator.h"
#include "mcpp/core/parameter.h"

namespace mcpp::tensor_parallel {

class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(ParameterRegistry& params, const std::string& key, int64_t padded_vocab, int64_t hidden,
                         float init_std, comm::CommPtr tp);
  Tensor forward(const Tensor& ids /*[n] int32*/) const;               // -> [n, h]
  void backward(const Tensor& ids, const Tensor& dout /*[n, h]*/) const;  // accumulates into main_grad
  Parameter* weight() const { return weight_; }
  int64_t vocab_start() const { return vocab_start_; }

 private:
  comm::CommPtr tp_;
  Parameter* weight_ = nullptr;
  int64_t vocab_start_ = 0, hidden_ = 0;
};

void vocab_parallel_cross_entropy_fwd(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                                      int64_t vocab_start, comm::Communicator& tp);
void vocab_parallel_cross_entropy_bwd(Tensor& dlogits, const Tensor& dloss, const Tensor& logits,
                                      const Tensor& targets, const Tensor& lse, int64_t vocab_start,
                                      comm::Communicator& tp);

}  // namespace mcpp::tensor_parallel
