// Parameter, ParameterRegistry and the stale-main-grad protocol; contract in parameter.h.
#include "mcpp/core/parameter.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/core/rng.h"

namespace mcpp {

Parameter* ParameterRegistry::add(ParamSpec spec) {
  MCPP_CHECK(find(spec.key) == nullptr, "parameter key '{}' registered twice", spec.key);
  auto p = std::make_unique<Parameter>();
  p->spec = std::move(spec);
  p->registry = this;
  by_key_[p->spec.key] = p.get();
  params_.push_back(std::move(p));
  return params_.back().get();
}

void ParameterRegistry::add_rank_state(const std::string& key, Tensor* state) {
  for (const auto& [k, t] : rank_states_) MCPP_CHECK(k != key, "module state '{}' registered twice", key);
  rank_states_.emplace_back(key, state);
}

Parameter* ParameterRegistry::find(const std::string& key) const {
  const auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second;
}

void init_normal(Tensor& t, float std, uint64_t seed, const std::string& key) {
  const uint64_t stream = seed ^ XXH3_64bits(key.data(), key.size());
  float* out = t.data<float>();
  const int64_t n = t.numel();
  // Box-Muller on Philox draws: each 4x32 block gives two normals.
  for (int64_t i = 0; i < n; i += 2) {
    auto r = philox4x32_10(stream, static_cast<uint64_t>(i / 2), 0x5eedULL);
    double u1 = (static_cast<double>(r[0]) + 1.0) / 4294967297.0;  // (0, 1]
    double u2 = static_cast<double>(r[1]) / 4294967296.0;
    double rad = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * rad * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(std * rad * std::sin(2.0 * M_PI * u2));
  }
}

namespace {
// Rows x cols view of a tensor split at partition_dim: outer = prod(dims before), inner = prod(after).
struct SplitDims {
  int64_t outer = 1, dim = 1, inner = 1;
};
SplitDims split_dims(const Shape& shape, int d) {
  SplitDims s;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (i < d) s.outer *= shape[i];
    else if (i == d) s.dim = shape[i];
    else s.inner *= shape[i];
  }
  return s;
}
template <bool kToGlobal>
void copy_shard(float* global, const Shape& gshape, float* local, const Shape& lshape, const TensorShard& shard) {
  const SplitDims g = split_dims(gshape, shard.partition_dim), l = split_dims(lshape, shard.partition_dim);
  MCPP_CHECK(g.outer == l.outer && g.inner == l.inner, "shard {} does not fit global {}", shape_str(lshape),
             shape_str(gshape));
  for (const ShardSegment& seg : shard.segments) {
    MCPP_CHECK(seg.global_offset + seg.length <= g.dim && seg.local_offset + seg.length <= l.dim,
               "shard segment out of range: global {} local {}", shape_str(gshape), shape_str(lshape));
    for (int64_t o = 0; o < g.outer; ++o) {
      float* gp = global + (o * g.dim + seg.global_offset) * g.inner;
      float* lp = local + (o * l.dim + seg.local_offset) * l.inner;
      const size_t n = static_cast<size_t>(seg.length * g.inner);
      if constexpr (kToGlobal) std::copy_n(lp, n, gp);
      else std::copy_n(gp, n, lp);
    }
  }
}
}  // namespace

void copy_shard_from_global(Tensor& local, const Tensor& global, const TensorShard& shard) {
  copy_shard<false>(global.data<float>(), global.shape(), local.data<float>(), local.shape(), shard);
}

void copy_shard_to_global(Tensor& global, const Tensor& local, const TensorShard& shard) {
  copy_shard<true>(global.data<float>(), global.shape(), local.data<float>(), local.shape(), shard);
}

// Sorted by (registry, offset): each run of adjacent stale parameters of one registry is one fill.
void zero_stale_main_grads(std::vector<Parameter*> ps) {
  std::erase_if(ps, [](const Parameter* p) { return !p || !p->grad_stale; });
  if (ps.empty()) return;
  std::sort(ps.begin(), ps.end(), [](const Parameter* a, const Parameter* b) {
    return std::tie(a->registry, a->offset) < std::tie(b->registry, b->offset);
  });
  size_t i = 0;
  while (i < ps.size()) {
    ParameterRegistry* reg = ps[i]->registry;
    const int64_t begin = ps[i]->offset;
    int64_t end = begin + ps[i]->main_grad.numel();
    size_t j = i + 1;
    for (; j < ps.size() && ps[j]->registry == reg && ps[j]->offset == end; ++j) end += ps[j]->main_grad.numel();
    if (reg) {
      reg->zero_main_grads(begin, end - begin);
    } else {
      for (size_t q = i; q < j; ++q) ps[q]->main_grad.zero_();
    }
    for (size_t q = i; q < j; ++q) ps[q]->grad_stale = false;
    i = j;
  }
}

bool take_grad_overwrite(std::initializer_list<Parameter*> params) {
  bool all_stale = false;
  for (Parameter* p : params) {
    if (!p) continue;
    if (!p->grad_stale) {
      materialize_grads(params);
      return false;
    }
    all_stale = true;
  }
  for (Parameter* p : params)
    if (p) p->grad_stale = false;
  return all_stale;
}

void materialize_grads(std::initializer_list<Parameter*> params) {
  zero_stale_main_grads(std::vector<Parameter*>(params));
}

bool counts_in_grad_norm(const ParamSpec& spec, int tp_rank) {
  return !spec.shared_copy && (spec.shard.partitioned() || tp_rank == 0);
}

void Parameter::grad_ready() {
  MCPP_CHECK(!grad_stale, "parameter '{}' reported grad ready but its main_grad was never written this step (a "
             "backward wrote it without take_grad_overwrite / materialize_grads)", spec.key);
  if (registry) registry->on_grad_ready(*this);
}

}  // namespace mcpp
