#include "mcpp/transformer/ctx_tensors.h"

#include "mcpp/tensor_parallel/layers.h"
#include "mcpp/transformer/attention.h"
#include "mcpp/transformer/dot_product_attention.h"
#include "mcpp/transformer/mlp.h"
#include "mcpp/transformer/moe/moe_layer.h"
#include "mcpp/transformer/multi_latent_attention.h"
#include "mcpp/transformer/norms.h"

namespace mcpp {

namespace tensor_parallel {
void visit_ctx_tensors(const ParallelLinearCtx& c, const TensorVisitor& f) {
  f(c.x), f(c.fp8_saved.x), f(c.fp8_saved.w);  // FP8: the backward's casts in place of x
}
}  // namespace tensor_parallel

void visit_ctx_tensors(const NormCtx& c, const TensorVisitor& f) { f(c.x), f(c.mean), f(c.rstd); }

void visit_ctx_tensors(const CoreAttentionCtx& c, const TensorVisitor& f) {
  for (const Tensor* t : {&c.q, &c.k, &c.v, &c.qkv, &c.out, &c.lse, &c.probs}) f(*t);
}

void visit_ctx_tensors(const SelfAttentionCtx& c, const TensorVisitor& f) {
  visit_ctx_tensors(c.qkv, f), visit_ctx_tensors(c.core, f), visit_ctx_tensors(c.proj, f);
  f(c.q), f(c.k), f(c.v), f(c.fused_qkv);
  visit_ctx_tensors(c.q_norm, f), visit_ctx_tensors(c.k_norm, f);
}

void visit_ctx_tensors(const MLASelfAttentionCtx& c, const TensorVisitor& f) {
  for (const auto* l : {&c.q_down, &c.q_up, &c.kv_down, &c.kv_up, &c.proj}) visit_ctx_tensors(*l, f);
  visit_ctx_tensors(c.q_norm, f), visit_ctx_tensors(c.kv_norm, f), visit_ctx_tensors(c.core, f);
  f(c.query), f(c.key), f(c.value), f(c.k_pe);
}

void visit_ctx_tensors(const MLPCtx& c, const TensorVisitor& f) {
  visit_ctx_tensors(c.fc1, f), f(c.pre_act), visit_ctx_tensors(c.fc2, f);
}

namespace moe {
// Not m.experts.counts: GroupedMLP's rows per expert are the router's device counts (m.router.counts, visited) or the
// layer's cached copy of the plan's host counts (MoELayer::expert_counts: module state, like position_ids).
void visit_ctx_tensors(const MoELayerCtx& m, const TensorVisitor& f) {
  for (const Tensor* t : {&m.router.x, &m.router.jittered, &m.router.topk, &m.router.probs, &m.router.scores,
                          &m.router.lse, &m.router.idx, &m.router.aux_counts, &m.router.z_scores, &m.router.z_lse,
                          &m.router.counts, &m.plan.idx, &m.probs, &m.combined, &m.experts.x, &m.experts.pre_act,
                          &m.experts.act, &m.gate, &m.gate_scores, &m.gate_lse, &m.gate_top, &m.shared_out})
    f(*t);
  for (const MLPCtx& e : m.experts.mlp) mcpp::visit_ctx_tensors(e, f);
  mcpp::visit_ctx_tensors(m.shared, f);
}
}  // namespace moe

}  // namespace mcpp
