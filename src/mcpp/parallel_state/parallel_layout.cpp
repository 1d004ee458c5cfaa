// ParallelLayout and the launch-time arithmetic (group kinds, parallel_options): see parallel_context.h. The group
// lists come from RankGenerator (Megatron's arithmetic); the creation order follows Megatron-Core's
// initialize_model_parallel so that every rank issues the same sequence of collective new_group calls. No
// communicator is touched here (ParallelContext, which creates the groups, is parallel_context.cpp), so config
// validation can lay out a launch without one.
#include <algorithm>
#include <utility>

#include "mcpp/core/error.h"
#include "mcpp/parallel_state/parallel_context.h"

namespace mcpp::parallel_state {

const char* group_kind_name(GroupKind k) {
  switch (k) {
    case GroupKind::DpCp: return "dp_cp";
    case GroupKind::Dp: return "dp";
    case GroupKind::Cp: return "cp";
    case GroupKind::Mp: return "mp";
    case GroupKind::Tp: return "tp";
    case GroupKind::Pp: return "pp";
    case GroupKind::Embedding: return "embd";
    case GroupKind::PositionEmbedding: return "pos_embd";
    case GroupKind::TpCp: return "tp_cp";
    case GroupKind::Ep: return "ep";
    case GroupKind::ExpertTp: return "expert_tp";
    case GroupKind::TpEp: return "tp_ep";
    case GroupKind::ExpertDp: return "expert_dp";
  }
  return "?";
}

std::vector<GroupKind> all_group_kinds() {
  std::vector<GroupKind> out;
  for (int i = 0; i < kNumGroupKinds; ++i) out.push_back(static_cast<GroupKind>(i));
  return out;
}

namespace {

int to_int_size(int64_t v, const char* field) {
  if (v < 1) fail("{} must be >= 1, got {}", field, v);
  if (v > (1 << 20)) fail("{} ({}) is too large", field, v);
  return static_cast<int>(v);
}

std::vector<int> embedding_ranks(const std::vector<int>& pp_ranks) {  // Megatron's default_embedding_ranks
  if (pp_ranks.size() == 1) return {pp_ranks.front()};
  return {pp_ranks.front(), pp_ranks.back()};
}

}  // namespace

ParallelLayout::ParallelLayout(int world, int tp, int pp, int cp, int ep, int etp, RankGenerator decoder,
                               RankGenerator expert)
    : world_(world), tp_(tp), pp_(pp), cp_(cp), dp_(world / (tp * pp * cp)), ep_(ep), etp_(etp),
      edp_(world / (etp * ep * pp)), decoder_(std::move(decoder)), expert_(std::move(expert)) {}

ParallelLayout ParallelLayout::make(int64_t world_size, const ParallelOptions& opt) {
  const int world = to_int_size(world_size, "world size");
  const int tp = to_int_size(opt.tensor_model_parallel_size, "tensor_model_parallel_size");
  const int pp = to_int_size(opt.pipeline_model_parallel_size, "pipeline_model_parallel_size");
  const int cp = to_int_size(opt.context_parallel_size, "context_parallel_size");
  const int ep = to_int_size(opt.expert_model_parallel_size, "expert_model_parallel_size");
  const int etp = opt.expert_tensor_parallel_size == 0
                      ? tp
                      : to_int_size(opt.expert_tensor_parallel_size, "expert_tensor_parallel_size");
  if (world % (tp * pp * cp) != 0)
    fail("world size ({}) must be divisible by tensor_model_parallel_size * pipeline_model_parallel_size * "
         "context_parallel_size ({} * {} * {} = {})", world, tp, pp, cp, tp * pp * cp);
  if (world % (etp * ep * pp) != 0)
    fail("world size ({}) must be divisible by expert_tensor_parallel_size * expert_model_parallel_size * "
         "pipeline_model_parallel_size ({} * {} * {} = {})", world, etp, ep, pp, etp * ep * pp);
  const int dp = world / (tp * pp * cp), edp = world / (etp * ep * pp);
  RankGenerator decoder({.tp = tp, .ep = 1, .dp = dp, .pp = pp, .cp = cp, .order = opt.order});
  RankGenerator expert({.tp = etp, .ep = ep, .dp = edp, .pp = pp, .cp = 1, .order = opt.order});
  std::string lower(opt.order);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool pp_last = lower.size() >= 2 && lower.compare(lower.size() - 2, 2, "pp") == 0;
  if (!pp_last && pp > 1 && edp != dp)
    fail("order '{}' does not end with pp, so the data-parallel sizes of the dense ({}) and expert ({}) grids "
         "must be equal (Megatron)", opt.order, dp, edp);
  if (decoder.get_ranks("pp") != expert.get_ranks("pp"))
    fail("order '{}' with expert_tensor_parallel_size {} and expert_model_parallel_size {} gives pipeline "
         "groups that differ between the dense and expert grids (Megatron requires them equal)",
         opt.order, etp, ep);
  return ParallelLayout(world, tp, pp, cp, ep, etp, std::move(decoder), std::move(expert));
}

RankGroups ParallelLayout::groups(GroupKind k) const {
  switch (k) {
    case GroupKind::DpCp: return decoder_.get_ranks("dp-cp");
    case GroupKind::Dp: return decoder_.get_ranks("dp");
    case GroupKind::Cp: return decoder_.get_ranks("cp");
    case GroupKind::Mp: return decoder_.get_ranks("tp-pp");
    case GroupKind::Tp: return decoder_.get_ranks("tp");
    case GroupKind::Pp: return decoder_.get_ranks("pp");
    case GroupKind::Embedding:
    case GroupKind::PositionEmbedding: {
      RankGroups out;
      for (const auto& g : decoder_.get_ranks("pp"))
        out.push_back(k == GroupKind::Embedding ? embedding_ranks(g) : std::vector<int>{g.front()});
      return out;
    }
    case GroupKind::TpCp: return decoder_.get_ranks("tp-cp");
    case GroupKind::Ep: return expert_.get_ranks("ep");
    case GroupKind::ExpertTp: return expert_.get_ranks("tp");
    case GroupKind::TpEp: return expert_.get_ranks("tp-ep");
    case GroupKind::ExpertDp: return expert_.get_ranks("dp");
  }
  fail("ParallelLayout::groups: unknown group kind {}", static_cast<int>(k));
}

RankCoordinates ParallelLayout::coordinates(int rank) const {
  if (rank < 0 || rank >= world_) fail("rank {} is outside the world [0, {})", rank, world_);
  return {.tp = decoder_.coordinate(rank, "tp"),
          .cp = decoder_.coordinate(rank, "cp"),
          .dp = decoder_.coordinate(rank, "dp"),
          .pp = decoder_.coordinate(rank, "pp"),
          .expert_tp = expert_.coordinate(rank, "tp"),
          .ep = expert_.coordinate(rank, "ep"),
          .expert_dp = expert_.coordinate(rank, "dp")};
}

int ParallelLayout::group_index(GroupKind k, int rank) const {
  RankGroups gs = groups(k);
  for (size_t i = 0; i < gs.size(); ++i)
    if (std::find(gs[i].begin(), gs[i].end(), rank) != gs[i].end()) return static_cast<int>(i);
  return -1;
}

std::vector<GroupCreation> ParallelLayout::creation_sequence() const {
  std::vector<GroupCreation> seq;
  auto add_all = [&](GroupKind k) {
    for (auto& g : groups(k)) seq.push_back({k, std::move(g)});
  };
  for (GroupKind k : {GroupKind::DpCp, GroupKind::Dp, GroupKind::Cp, GroupKind::Mp, GroupKind::Tp}) add_all(k);
  for (auto& g : decoder_.get_ranks("pp")) {
    seq.push_back({GroupKind::Pp, g});
    seq.push_back({GroupKind::Embedding, embedding_ranks(g)});
    seq.push_back({GroupKind::PositionEmbedding, {g.front()}});
  }
  for (GroupKind k : {GroupKind::TpCp, GroupKind::Ep, GroupKind::ExpertTp, GroupKind::TpEp, GroupKind::ExpertDp})
    add_all(k);
  return seq;
}

ParallelOptions parallel_options(const ParallelConfig& p) {
  ParallelOptions opt;
  opt.tensor_model_parallel_size = p.tensor_model_parallel_size;
  opt.pipeline_model_parallel_size = p.pipeline_model_parallel_size;
  opt.context_parallel_size = p.context_parallel_size;
  opt.expert_model_parallel_size = p.expert_model_parallel_size;
  opt.expert_tensor_parallel_size = p.expert_tensor_parallel_size;
  opt.order = p.rank_order;
  opt.pipeline_model_parallel_layout = p.pipeline_model_parallel_layout;
  return opt;
}

}  // namespace mcpp::parallel_state
