// Parallel state as a value (DESIGN.md decision 2): ParallelLayout is the pure rank arithmetic of one
// launch (sizes, every group of every kind, each rank's coordinates), ParallelContext is one rank's view
// of it with the communicators of the groups it belongs to. No globals; pass the context to constructors.
//
// Grids, as Megatron-Core's initialize_model_parallel builds them:
//   decoder grid  RankGenerator{tp, ep=1, dp, pp, cp, order}      dp = world / (tp*pp*cp)
//   expert grid   RankGenerator{expert_tp, ep, expert_dp, pp, cp=1, same order}
//                                                                 expert_dp = world / (expert_tp*ep*pp)
// With the default order "tp-cp-ep-dp-pp": rank = tp_r + tp*(cp_r + cp*(dp_r + dp*pp_r)).
//
// Group kinds (GroupKind) and the RankGenerator token each comes from:
//   dp_cp 'dp-cp'  dp 'dp'  cp 'cp'  mp 'tp-pp'  tp 'tp'  pp 'pp'
//   embd      first and last rank of each pp group (pp == 1: the rank alone)
//   pos_embd  first rank of each pp group
//   tp_cp 'tp-cp'                                  (decoder grid)
//   ep 'ep'  expert_tp 'tp'  tp_ep 'tp-ep'  expert_dp 'dp'   (expert grid)
//
// ParallelContext::create calls world->new_group(kind name, ranks) for EVERY group of every kind in one
// canonical order (ParallelLayout::creation_sequence, Megatron's creation order) on every rank, so the
// collective new_group calls line up across ranks; each rank keeps the groups that contain it. A rank
// outside every embedding group holds a null embedding() (likewise position_embedding()).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mcpp/comm/communicator.h"
#include "mcpp/parallel_state/parallel_config.h"
#include "mcpp/parallel_state/rank_generator.h"

namespace mcpp::parallel_state {

using comm::CommPtr;

// Launch-time parallel options. Sizes mirror Megatron-LM's flags; ParallelConfig carries tp/pp/cp,
// the expert fields and the order live here until the config grows them.
struct ParallelOptions {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t context_parallel_size = 1;
  int64_t expert_model_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 0;  // 0 -> tensor_model_parallel_size (Megatron's default)
  std::string order = "tp-cp-ep-dp-pp";
  // Megatron's --pipeline-model-parallel-layout: when given, the pipeline layout code owns the
  // layers-per-stage rule and validate_parallel_layout skips num_layers % pipeline_model_parallel_size.
  std::string pipeline_model_parallel_layout{};
};

enum class GroupKind { DpCp, Dp, Cp, Mp, Tp, Pp, Embedding, PositionEmbedding, TpCp, Ep, ExpertTp, TpEp, ExpertDp };
constexpr int kNumGroupKinds = 13;
const char* group_kind_name(GroupKind k);  // "dp_cp", "dp", ..., "embd", "pos_embd", ..., "expert_dp"
std::vector<GroupKind> all_group_kinds();  // the enum order above

struct RankCoordinates {
  int tp = 0, cp = 0, dp = 0, pp = 0;         // decoder grid
  int expert_tp = 0, ep = 0, expert_dp = 0;   // expert grid (pp is shared)
};

struct GroupCreation {
  GroupKind kind;
  std::vector<int> ranks;  // global ranks, group order
};

class ParallelLayout {
 public:
  // Validates (mcpp::Error naming the field) and builds both grids.
  static ParallelLayout make(int64_t world_size, const ParallelOptions& opt);

  int world_size() const { return world_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int ep() const { return ep_; }
  int expert_tp() const { return etp_; }
  int expert_dp() const { return edp_; }
  const std::string& order() const { return decoder_.order(); }  // normalized
  const RankGenerator& decoder() const { return decoder_; }
  const RankGenerator& expert() const { return expert_; }

  RankGroups groups(GroupKind k) const;          // every group of kind k, Megatron's order
  RankCoordinates coordinates(int rank) const;
  // Index into groups(k) of the group holding `rank`; -1 when none (embd / pos_embd only).
  int group_index(GroupKind k, int rank) const;
  // Every group of every kind in the canonical creation order (Megatron's): dp_cp, dp, cp, mp, tp,
  // then per pp group: pp, embd, pos_embd; then tp_cp, ep, expert_tp, tp_ep, expert_dp.
  std::vector<GroupCreation> creation_sequence() const;

 private:
  ParallelLayout(int world, int tp, int pp, int cp, int ep, int etp, RankGenerator decoder, RankGenerator expert);
  int world_, tp_, pp_, cp_, dp_, ep_, etp_, edp_;
  RankGenerator decoder_, expert_;
};

// ParallelOptions from the parallel config: tp / pp / cp, the expert sizes, the rank order and the pipeline layout.
// (The launch-layout rules against the model, validate_parallel_layout, are training/config.h's.)
ParallelOptions parallel_options(const ParallelConfig& p);

class ParallelContext {
 public:
  // Collective over `world`: every rank of world calls it with the same options.
  static ParallelContext create(CommPtr world, const ParallelOptions& opt);
  // One process: every group is a size-1 group made from `local` (which must have size 1).
  static ParallelContext single(CommPtr local);

  const ParallelLayout& layout() const { return layout_; }
  int rank() const { return rank_; }  // global
  int world_size() const { return layout_.world_size(); }
  const RankCoordinates& coords() const { return coords_; }

  int tp_size() const { return layout_.tp(); }
  int pp_size() const { return layout_.pp(); }
  int dp_size() const { return layout_.dp(); }
  int cp_size() const { return layout_.cp(); }
  int ep_size() const { return layout_.ep(); }
  int expert_tp_size() const { return layout_.expert_tp(); }
  int expert_dp_size() const { return layout_.expert_dp(); }
  int tp_rank() const { return coords_.tp; }
  int pp_rank() const { return coords_.pp; }
  int dp_rank() const { return coords_.dp; }
  int cp_rank() const { return coords_.cp; }
  int ep_rank() const { return coords_.ep; }
  int expert_tp_rank() const { return coords_.expert_tp; }
  int expert_dp_rank() const { return coords_.expert_dp; }

  bool is_pipeline_first_stage() const { return coords_.pp == 0; }
  bool is_pipeline_last_stage() const { return coords_.pp == layout_.pp() - 1; }
  bool is_in_embedding_group() const { return group(GroupKind::Embedding) != nullptr; }
  // Global ranks of the previous / next pipeline stage (wrapping, as Megatron's p2p uses them).
  int pipeline_prev_rank() const;
  int pipeline_next_rank() const;

  const CommPtr& world() const { return world_; }
  const CommPtr& tp() const { return group(GroupKind::Tp); }
  const CommPtr& pp() const { return group(GroupKind::Pp); }
  const CommPtr& dp() const { return group(GroupKind::Dp); }
  const CommPtr& cp() const { return group(GroupKind::Cp); }
  const CommPtr& dp_cp() const { return group(GroupKind::DpCp); }
  const CommPtr& mp() const { return group(GroupKind::Mp); }
  const CommPtr& tp_cp() const { return group(GroupKind::TpCp); }
  const CommPtr& embedding() const { return group(GroupKind::Embedding); }  // null outside the embedding group
  const CommPtr& position_embedding() const { return group(GroupKind::PositionEmbedding); }  // null if not stage 0
  const CommPtr& ep() const { return group(GroupKind::Ep); }
  const CommPtr& expert_tp() const { return group(GroupKind::ExpertTp); }
  const CommPtr& tp_ep() const { return group(GroupKind::TpEp); }
  const CommPtr& expert_dp() const { return group(GroupKind::ExpertDp); }
  const CommPtr& group(GroupKind k) const { return groups_[static_cast<size_t>(k)]; }

 private:
  ParallelContext(ParallelLayout layout, CommPtr world);
  ParallelLayout layout_;
  CommPtr world_;
  int rank_ = 0;
  RankCoordinates coords_;
  std::vector<CommPtr> groups_;  // indexed by GroupKind; null where this rank is in no group of the kind
};

}  // namespace mcpp::parallel_state
