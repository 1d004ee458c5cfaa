// RankGenerator: see rank_generator.h. Transcribes Megatron-Core's generate_masked_orthogonal_rank_groups
// (prefix-product strides, decompose group index over the unmasked dims and rank-in-group over the masked
// dims) and RankGenerator (order normalization, masks from tokens, rank offset).
#include "mcpp/parallel_state/rank_generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "mcpp/core/error.h"

namespace mcpp::parallel_state {
namespace {

constexpr std::array<std::string_view, 5> kNames = {"tp", "pp", "dp", "ep", "cp"};

std::vector<std::string> split_dash(std::string_view s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (true) {
    size_t e = s.find('-', b);
    out.emplace_back(s.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
    if (e == std::string_view::npos) break;
    b = e + 1;
  }
  return out;
}

std::vector<int> prefix_product(const std::vector<int>& a) {
  std::vector<int> r{1};
  for (int v : a) r.push_back(r.back() * v);
  return r;
}

// idx[i] = (index / stride[i]) % shape[i] with stride = prefix_product(shape).
std::vector<int> decompose(int index, const std::vector<int>& shape) {
  std::vector<int> stride = prefix_product(shape), idx(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) idx[i] = (index / stride[i]) % shape[i];
  return idx;
}

int inner_product(const std::vector<int>& a, const std::vector<int>& b) {
  int s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

RankGroups generate_masked_orthogonal_rank_groups(int world_size, const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask) {
  MCPP_CHECK(parallel_size.size() == mask.size(), "parallel_size and mask lengths differ");
  std::vector<int> global_stride = prefix_product(parallel_size);
  MCPP_CHECK(global_stride.back() == world_size, "world size {} != product of parallel sizes {}", world_size,
             global_stride.back());
  std::vector<int> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  for (size_t i = 0; i < mask.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  const int group_size = prefix_product(masked_shape).back();
  const int num_groups = world_size / group_size;
  RankGroups ranks(static_cast<size_t>(num_groups));
  for (int g = 0; g < num_groups; ++g) {
    const int base = inner_product(decompose(g, unmasked_shape), unmasked_stride);
    auto& group = ranks[static_cast<size_t>(g)];
    group.reserve(static_cast<size_t>(group_size));
    for (int r = 0; r < group_size; ++r) group.push_back(base + inner_product(decompose(r, masked_shape), masked_stride));
  }
  return ranks;
}

RankGenerator::RankGenerator(const RankGeneratorOptions& opt) : rank_offset_(opt.rank_offset) {
  const std::array<int, 5> size_of = {opt.tp, opt.pp, opt.dp, opt.ep, opt.cp};  // kNames order
  for (size_t i = 0; i < kNames.size(); ++i)
    if (size_of[i] < 1) fail("RankGenerator: {} size must be >= 1, got {}", kNames[i], size_of[i]);
  if (opt.ep != 1 && opt.cp != 1)
    fail("RankGenerator: ep ({}) and cp ({}) are both > 1; CP belongs to the decoder grid and EP to the expert "
         "grid (Megatron)", opt.ep, opt.cp);
  std::string lower(opt.order);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const std::string& t : split_dash(lower)) {
    auto it = std::find(kNames.begin(), kNames.end(), t);
    if (it == kNames.end())
      fail("order '{}': unknown dimension '{}' (expected '-'-separated tp, cp, ep, dp, pp)", opt.order, t);
    if (std::find(names_.begin(), names_.end(), t) != names_.end())
      fail("order '{}': dimension '{}' appears twice", opt.order, t);
    names_.push_back(t);
    sizes_.push_back(size_of[static_cast<size_t>(it - kNames.begin())]);
  }
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (std::find(names_.begin(), names_.end(), kNames[i]) != names_.end()) continue;
    if (size_of[i] != 1)
      fail("order '{}' does not name {} but its size is {} (only size-1 dimensions may be omitted)", opt.order,
           kNames[i], size_of[i]);
    names_.emplace_back(kNames[i]);  // appended, as Megatron does
    sizes_.push_back(1);
  }
  for (size_t i = 0; i < names_.size(); ++i) {
    order_ += (i ? "-" : "") + names_[i];
    world_size_ *= sizes_[i];
  }
}

int RankGenerator::index_of(std::string_view name, std::string_view what) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  if (it == names_.end())
    fail("RankGenerator: unknown dimension '{}' in {} (expected tp, cp, ep, dp, pp)", name, what);
  return static_cast<int>(it - names_.begin());
}

int RankGenerator::size(std::string_view name) const {
  return sizes_[static_cast<size_t>(index_of(name, "size()"))];
}

RankGroups RankGenerator::get_ranks(std::string_view token) const {
  std::vector<bool> mask(names_.size(), false);
  for (const std::string& t : split_dash(token))
    mask[static_cast<size_t>(index_of(t, fmt::format("token '{}'", token)))] = true;
  RankGroups ranks = generate_masked_orthogonal_rank_groups(world_size_, sizes_, mask);
  for (auto& group : ranks)
    for (int& r : group) r += rank_offset_;
  return ranks;
}

int RankGenerator::coordinate(int rank, std::string_view name) const {
  const int local = rank - rank_offset_;
  if (local < 0 || local >= world_size_)
    fail("RankGenerator: rank {} is outside [{}, {})", rank, rank_offset_, rank_offset_ + world_size_);
  const int i = index_of(name, "coordinate()");
  int stride = 1;
  for (int k = 0; k < i; ++k) stride *= sizes_[static_cast<size_t>(k)];
  return (local / stride) % sizes_[static_cast<size_t>(i)];
}

}  // namespace mcpp::parallel_state
