// ParallelContext: the process groups of a ParallelLayout over the world communicator; see parallel_context.h (the
// layout's arithmetic is parallel_layout.cpp).
#include "mcpp/parallel_state/parallel_context.h"

#include <algorithm>
#include <utility>

#include "mcpp/core/error.h"

namespace mcpp::parallel_state {

ParallelContext::ParallelContext(ParallelLayout layout, CommPtr world)
    : layout_(std::move(layout)), world_(std::move(world)), groups_(kNumGroupKinds) {}

ParallelContext ParallelContext::create(CommPtr world, const ParallelOptions& opt) {
  if (!world) fail("ParallelContext::create: world communicator is null");
  ParallelContext ctx(ParallelLayout::make(world->size(), opt), world);
  ctx.rank_ = world->rank();
  ctx.coords_ = ctx.layout_.coordinates(ctx.rank_);
  const std::vector<int>& global = world->global_ranks();  // layout rank r is world member r
  for (const GroupCreation& c : ctx.layout_.creation_sequence()) {
    std::vector<int> members;
    members.reserve(c.ranks.size());
    for (int r : c.ranks) members.push_back(global[static_cast<size_t>(r)]);
    CommPtr g = world->new_group(group_kind_name(c.kind), members);  // collective over world
    if (std::find(c.ranks.begin(), c.ranks.end(), ctx.rank_) == c.ranks.end()) continue;
    MCPP_CHECK(g && g->size() == static_cast<int>(members.size()) && g->global_rank() == global[ctx.rank_],
               "rank {}: new_group '{}' returned a communicator that does not match its member list",
               ctx.rank_, group_kind_name(c.kind));
    CommPtr& slot = ctx.groups_[static_cast<size_t>(c.kind)];
    MCPP_CHECK(!slot, "rank {} is in two '{}' groups", ctx.rank_, group_kind_name(c.kind));
    slot = std::move(g);
  }
  for (GroupKind k : all_group_kinds())
    if (k != GroupKind::Embedding && k != GroupKind::PositionEmbedding)
      MCPP_CHECK(ctx.group(k), "rank {} is in no '{}' group", ctx.rank_, group_kind_name(k));
  return ctx;
}

ParallelContext ParallelContext::single(CommPtr local) {
  if (!local || local->size() != 1)
    fail("ParallelContext::single needs a communicator of size 1, got size {}", local ? local->size() : 0);
  return create(std::move(local), ParallelOptions{});
}

int ParallelContext::pipeline_prev_rank() const {
  const auto& r = pp()->global_ranks();
  return r[static_cast<size_t>((pp_rank() + pp_size() - 1) % pp_size())];
}

int ParallelContext::pipeline_next_rank() const {
  const auto& r = pp()->global_ranks();
  return r[static_cast<size_t>((pp_rank() + 1) % pp_size())];
}

}  // namespace mcpp::parallel_state
