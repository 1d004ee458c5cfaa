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
  void operator()(const NormCtx& n) { (*this)(n.x), (*this)(n.mean), (*this)(n.rstd); }
  void operator()(const tensor_parallel::ParallelLinearCtx& l) { (*this)(l.x); }
  void operator()(const CoreAttentionCtx& c) {
    for (const Tensor* t : {&c.q, &c.k, &c.v, &c.qkv, &c.out, &c.lse, &c.probs}) (*this)(*t);
  }
  void operator()(const moe::MoELayerCtx& m) {
    for (const Tensor* t : {&m.router.x, &m.router.jittered, &m.router.topk, &m.router.probs, &m.router.scores,
                            &m.router.lse, &m.router.idx, &m.router.aux_counts, &m.router.z_scores,
                            &m.router.z_lse, &m.plan.idx, &m.probs, &m.combined, &m.experts.x, &m.gate,
                            &m.gate_scores, &m.gate_lse, &m.gate_top, &m.shared_out})
      (*this)(*t);
    for (const MLPCtx& e : m.experts.mlp) (*this)(e.fc1), (*this)(e.pre_act), (*this)(e.fc2);
    (*this)(m.shared.fc1), (*this)(m.shared.pre_act), (*this)(m.shared.fc2);
  }
  void operator()(const TransformerLayerCtx& l) {
    (*this)(l.input_layernorm);
    (*this)(l.self_attention.qkv), (*this)(l.self_attention.core), (*this)(l.self_attention.proj);
    (*this)(l.self_attention.q), (*this)(l.self_attention.k), (*this)(l.self_attention.v);
    (*this)(l.self_attention.fused_qkv);
    (*this)(l.self_attention.q_norm), (*this)(l.self_attention.k_norm);
    const MLASelfAttentionCtx& a = l.mla;  // multi-latent attention
    (*this)(a.q_down), (*this)(a.q_up), (*this)(a.kv_down), (*this)(a.kv_up), (*this)(a.proj);
    (*this)(a.q_norm), (*this)(a.kv_norm), (*this)(a.core);
    (*this)(a.query), (*this)(a.key), (*this)(a.value), (*this)(a.k_pe);
    (*this)(l.pre_mlp_layernorm);
    (*this)(l.mlp.fc1), (*this)(l.mlp.pre_act), (*this)(l.mlp.fc2);
    (*this)(l.moe);
    (*this)(l.mlp_input);
  }
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
