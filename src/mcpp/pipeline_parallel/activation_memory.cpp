#include "mcpp/pipeline_parallel/activation_memory.h"

#include <algorithm>
#include <utility>

namespace mcpp::pipeline_parallel {
namespace {

// Storages seen so far, each with the largest nbytes of the tensors that view it. Tensor exposes storage
// identity only as same_storage(), so this is a linear scan (a few hundred tensors per schedule at most).
struct Counter {
  std::vector<std::pair<Tensor, size_t>> seen;
  void operator()(const Tensor& t) {
    if (!t.defined()) return;
    for (auto& [u, n] : seen)
      if (u.same_storage(t)) {
        n = std::max(n, t.nbytes());
        return;
      }
    seen.emplace_back(t, t.nbytes());
  }
  size_t bytes() const {
    size_t b = 0;
    for (const auto& [u, n] : seen) b += n;
    return b;
  }
  // The contexts' own walks (transformer/ctx_tensors.h) report each tensor to this counter.
  TensorVisitor visitor() {
    return [this](const Tensor& t) { (*this)(t); };
  }
  void operator()(const NormCtx& n) { visit_ctx_tensors(n, visitor()); }
  void operator()(const tensor_parallel::ParallelLinearCtx& l) { tensor_parallel::visit_ctx_tensors(l, visitor()); }
  void operator()(const TransformerLayerCtx& l) { l.for_each_tensor(visitor()); }
  void operator()(const GPTModelCtx& g) {
    // Not position_ids: a view of the model's cached ids (model state, like the rotary tables).
    for (const Tensor* t : {&g.tokens, &g.input, &g.logits, &g.labels, &g.loss_mask, &g.lse, &g.loss_stats})
      (*this)(*t);
    for (const TransformerLayerCtx& l : g.decoder.layers) (*this)(l);
    for (const RecomputeState& r : g.decoder.recompute) (*this)(r.input);
    (*this)(g.decoder.final_layernorm);
    (*this)(g.output);
    for (const MtpDepthCtx& d : g.mtp) {
      for (const Tensor* t : {&d.tokens, &d.logits, &d.labels, &d.loss_mask, &d.lse, &d.loss_stats, &d.grad_stats,
                              &d.layer.hidden_in, &d.layer.embedding_in})
        (*this)(*t);
      (*this)(d.output);
      (*this)(d.layer.enorm), (*this)(d.layer.hnorm), (*this)(d.layer.eh_proj);
      (*this)(d.layer.layer), (*this)(d.layer.final_layernorm);
    }
  }
};

}  // namespace

size_t context_bytes(const std::vector<const GPTModelCtx*>& ctxs) {
  Counter c;
  for (const GPTModelCtx* g : ctxs) c(*g);
  return c.bytes();
}

}  // namespace mcpp::pipeline_parallel
