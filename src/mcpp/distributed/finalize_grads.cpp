#include "mcpp/distributed/finalize_grads.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {

void finalize_model_grads(ParamAndGradBuffer& params, const parallel_state::ParallelContext& pc,
                          bool tied_embeddings) {
  finalize_model_grads(std::vector<ParamAndGradBuffer*>{&params}, pc, tied_embeddings);
}

void finalize_model_grads(const std::vector<ParamAndGradBuffer*>& chunks, const parallel_state::ParallelContext& pc,
                          bool tied_embeddings) {
  allreduce_sequence_parallel_grads(chunks, pc);
  allreduce_embedding_grads(chunks, pc, tied_embeddings);
}

void allreduce_sequence_parallel_grads(const std::vector<ParamAndGradBuffer*>& chunks,
                                       const parallel_state::ParallelContext& pc) {
  for (ParamAndGradBuffer* params : chunks) params->zero_stale_grads();  // (DDP's grad sync did, normally)
  if (pc.tp_size() > 1)
    for (ParamAndGradBuffer* params : chunks)
      for (const auto& p : params->params())
        if (p->spec.sequence_parallel) pc.tp()->all_reduce(p->main_grad, comm::ReduceOp::Sum).wait();
}

void allreduce_embedding_grads(const std::vector<ParamAndGradBuffer*>& chunks,
                               const parallel_state::ParallelContext& pc, bool tied_embeddings) {
  // Tied word embeddings split over the first and last pipeline stage: sum both uses' gradients.
  if (tied_embeddings && pc.pp_size() > 1 && pc.is_in_embedding_group() && pc.embedding()->size() > 1) {
    Parameter* p = nullptr;
    for (ParamAndGradBuffer* params : chunks)
      if (Parameter* q = params->find("embedding.word_embeddings.weight")) p = q;
    MCPP_CHECK(p, "pipeline stage {} is in the embedding group but holds no word embeddings", pc.pp_rank());
    pc.embedding()->all_reduce(p->main_grad, comm::ReduceOp::Sum).wait();
  }
}

double model_grad_norm(ParamAndGradBuffer& params, const parallel_state::ParallelContext& pc) {
  return model_grad_norm(std::vector<ParamAndGradBuffer*>{&params}, pc);
}

namespace {
// This rank's sum of squares of the counted main grads of `chunks`. Runs of buffer-adjacent counted parameters
// reduce in one call (one device->host sync per run, not per parameter; at tp == 1 without shared copies the
// whole buffer is one run).
// `tp_rank`: the rank in the group that shards these parameters (TP for dense chunks, expert-TP for the expert
// buffers): each shard counts once, a replicated parameter on rank 0 only.
double local_sum_of_squares(const std::vector<ParamAndGradBuffer*>& chunks, int tp_rank) {
  double local = 0;
  for (ParamAndGradBuffer* params : chunks) {
    std::vector<std::pair<int64_t, int64_t>> runs;  // [offset, end) in the grad buffer
    for (const auto& p : params->params())
      if (counts_in_grad_norm(p->spec, tp_rank))
        runs.emplace_back(p->offset, p->offset + p->main_grad.numel());
    std::sort(runs.begin(), runs.end());
    for (size_t i = 0; i < runs.size();) {
      size_t j = i;
      while (j + 1 < runs.size() && runs[j + 1].first == runs[j].second) ++j;
      local += ops::sum_of_squares(params->grad_buffer().flat_slice(runs[i].first, {runs[j].second - runs[i].first}));
      i = j + 1;
    }
  }
  return local;
}

double host_sum(const comm::CommPtr& group, double v) {
  if (!group || group->size() == 1) return v;
  Tensor t = Tensor::empty({1}, DType::F32);
  // float64 would be better; the MPI backend reduces float32 tensors (one value, rounding ~1e-7 rel).
  t.data<float>()[0] = static_cast<float>(v);
  group->host().all_reduce(t, comm::ReduceOp::Sum).wait();
  return t.data<float>()[0];
}
}  // namespace

double model_grad_norm(const std::vector<ParamAndGradBuffer*>& chunks, const parallel_state::ParallelContext& pc) {
  return std::sqrt(host_sum(pc.mp(), local_sum_of_squares(chunks, pc.tp_rank())));
}

double model_grad_norm(const std::vector<ParamAndGradBuffer*>& chunks,
                       const std::vector<ParamAndGradBuffer*>& expert_chunks,
                       const parallel_state::ParallelContext& pc) {
  // dense: each TP shard once, over TP x PP; experts: each expert's shard once — over expert-TP and EP (its
  // replicas over expert-DP hold the same reduced grads), then PP.
  const double dense = host_sum(pc.mp(), local_sum_of_squares(chunks, pc.tp_rank()));
  const double experts = local_sum_of_squares(expert_chunks, pc.expert_tp_rank());
  return std::sqrt(dense + host_sum(pc.pp(), host_sum(pc.ep(), host_sum(pc.expert_tp(), experts))));
}

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(total_norm)) return 1.0;
  const double coef = max_norm / (total_norm + 1e-6);  // Megatron's clip_grad_by_total_norm_fp32
  return coef < 1.0 ? coef : 1.0;
}

double clip_grads_by_total_norm(ParamAndGradBuffer& params, double total_norm, double max_norm) {
  const double coef = clip_coefficient(total_norm, max_norm);
  if (coef >= 1.0) return 1.0;
  ops::scale_inplace(params.grad_buffer(), static_cast<float>(coef));
  return coef;
}

}  // namespace mcpp
