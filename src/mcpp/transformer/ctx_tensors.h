// What each module's context keeps alive between its forward and backward: visit_ctx_tensors(ctx, f) calls f on
// every tensor the Ctx struct holds (undefined ones included; the caller skips them). The activation-memory walk
// (pipeline_parallel/activation_memory.h) counts the storages they reach; the layer's type-erased submodule
// contexts (spec.h's SubmoduleCtx) call the overload of the Ctx they hold, found by argument-dependent lookup —
// so a new module declares its overload in its own namespace beside its Ctx.
#pragma once
#include <functional>

#include "mcpp/core/tensor.h"

namespace mcpp {

using TensorVisitor = std::function<void(const Tensor&)>;

struct NormCtx;
struct CoreAttentionCtx;
struct SelfAttentionCtx;
struct MLASelfAttentionCtx;
struct MLPCtx;
namespace tensor_parallel {
struct ParallelLinearCtx;
void visit_ctx_tensors(const ParallelLinearCtx& c, const TensorVisitor& f);
}  // namespace tensor_parallel

void visit_ctx_tensors(const NormCtx& c, const TensorVisitor& f);
void visit_ctx_tensors(const CoreAttentionCtx& c, const TensorVisitor& f);
void visit_ctx_tensors(const SelfAttentionCtx& c, const TensorVisitor& f);
void visit_ctx_tensors(const MLASelfAttentionCtx& c, const TensorVisitor& f);
void visit_ctx_tensors(const MLPCtx& c, const TensorVisitor& f);

namespace moe {
struct MoELayerCtx;
void visit_ctx_tensors(const MoELayerCtx& c, const TensorVisitor& f);
}  // namespace moe

}  // namespace mcpp
