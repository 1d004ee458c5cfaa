// RankGenerator — Megatron-Core's mapping from an order string and parallel sizes to rank groups
// (megatron/core/parallel_state.py: RankGenerator, generate_masked_orthogonal_rank_groups).
//
// The order string names the dimensions from fastest- to slowest-varying, e.g. "tp-cp-ep-dp-pp"
// (the default) or "tp-pp-dp". A global rank is the mixed-radix number of its coordinates:
//   rank = rank_offset + c[0] + s[0] * (c[1] + s[1] * (c[2] + ...))     (s = sizes in order)
// so with the default order rank = tp_r + tp*(cp_r + cp*(ep_r + ep*(dp_r + dp*pp_r))).
// Dimensions of size 1 that the order omits are appended (Megatron does the same); a dimension of
// size > 1 that the order omits, an unknown or repeated name is an mcpp::Error naming "order".
//
// get_ranks("tp-dp") returns every group spanned by the named dimensions: groups are enumerated by
// the remaining (unmasked) coordinates, first unmasked dimension fastest; inside a group, ranks are
// ordered by the masked coordinates, first masked dimension fastest — exactly Megatron's list order.
// Pure computation: no communication, no global state.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace mcpp::parallel_state {

using RankGroups = std::vector<std::vector<int>>;  // [num_groups][group_size] global ranks

// world_size = prod(parallel_size); mask[i] selects dimension i into the groups.
RankGroups generate_masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask);

struct RankGeneratorOptions {
  int tp = 1;
  int ep = 1;
  int dp = 1;
  int pp = 1;
  int cp = 1;
  std::string order = "tp-cp-ep-dp-pp";
  int rank_offset = 0;
};

class RankGenerator {
 public:
  explicit RankGenerator(const RankGeneratorOptions& opt);

  int world_size() const { return world_size_; }
  const std::string& order() const { return order_; }  // normalized: lower case, omitted size-1 dims appended
  int size(std::string_view name) const;               // "tp" | "pp" | "dp" | "ep" | "cp"

  // All groups spanned by the '-'-separated dimensions of `token` (e.g. "tp", "dp-cp", "tp-pp").
  RankGroups get_ranks(std::string_view token) const;
  // Coordinate of global `rank` along dimension `name` (its rank in the single-dimension group).
  int coordinate(int rank, std::string_view name) const;

 private:
  int index_of(std::string_view name, std::string_view what) const;

  std::vector<std::string> names_;  // in order
  std::vector<int> sizes_;          // in order
  std::string order_;
  int world_size_ = 1;
  int rank_offset_ = 0;
};

}  // namespace mcpp::parallel_state
