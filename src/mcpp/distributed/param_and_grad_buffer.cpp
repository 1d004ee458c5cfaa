#include "mcpp/distributed/param_and_grad_buffer.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/core/rng.h"

namespace mcpp {

Parameter* ParamAndGradBuffer::add(ParamSpec spec) {
  MCPP_CHECK(!finalized_, "parameter '{}' registered after the buffer was finalized", spec.key);
  MCPP_CHECK(find(spec.key) == nullptr, "parameter key '{}' registered twice", spec.key);
  auto p = std::make_unique<Parameter>();
  p->spec = std::move(spec);
  p->buffer = this;
  params_.push_back(std::move(p));
  return params_.back().get();
}

Parameter* ParamAndGradBuffer::find(const std::string& key) const {
  for (const auto& p : params_)
    if (p->spec.key == key) return p.get();
  return nullptr;
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

void ParamAndGradBuffer::finalize(uint64_t seed, Device device, DType param_dtype) {
  MCPP_CHECK(!finalized_, "ParamAndGradBuffer finalized twice");
  int64_t total = 0;
  for (const auto& p : params_) total += shape_numel(p->spec.shape);
  param_buffer_ = Tensor::zeros({total}, DType::F32, Device::CPU);
  grad_buffer_ = Tensor::zeros({total}, DType::F32, device);
  // Backward order: the last registered parameter (closest to the loss) sits at offset 0.
  int64_t offset = 0;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    Parameter& p = **it;
    const int64_t n = shape_numel(p.spec.shape);
    p.data = param_buffer_.flat_slice(offset, p.spec.shape);
    switch (p.spec.init) {
      case InitKind::Normal:
        if (p.spec.shard.partitioned()) {
          Tensor global = Tensor::empty(p.spec.shard.global_shape);
          init_normal(global, p.spec.std, seed, p.spec.key);
          copy_shard_from_global(p.data, global, p.spec.shard);
        } else {
          init_normal(p.data, p.spec.std, seed, p.spec.key);
        }
        break;
      case InitKind::Zeros: break;
      case InitKind::Ones: p.data.fill_(1.0f); break;
    }
    offset += n;
  }
  if (param_dtype != DType::F32) {
    // Megatron's mixed precision: the model copy is the master rounded to bf16/f16 (cast on the host,
    // round to nearest even), the master keeps the fp32 initial value.
    main_param_buffer_ = param_buffer_.to(device);
    param_buffer_ = param_buffer_.to(param_dtype).to(device);
  } else if (device != Device::CPU) {
    param_buffer_ = param_buffer_.to(device);
  }
  offset = 0;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    Parameter& p = **it;
    p.data = param_buffer_.flat_slice(offset, p.spec.shape);
    p.main_param = main_param_buffer().flat_slice(offset, p.spec.shape);
    p.main_grad = grad_buffer_.flat_slice(offset, p.spec.shape);
    p.offset = offset;
    offset += shape_numel(p.spec.shape);
  }
  finalized_ = true;
}

Tensor& ParamAndGradBuffer::main_param_buffer() {
  if (!mixed_precision()) return param_buffer_;
  if (main_params_released_)
    fail("ParamAndGradBuffer: the fp32 main params are sharded by the distributed optimizer (each DP rank "
         "holds only its shard); read them from the optimizer's pieces");
  return main_param_buffer_;
}

void ParamAndGradBuffer::release_main_params() {
  MCPP_CHECK(finalized_, "ParamAndGradBuffer::release_main_params before finalize");
  if (!mixed_precision())
    fail("ParamAndGradBuffer: release_main_params needs mixed precision (with {} params the model params are "
         "the main params)", dtype_name(param_buffer_.dtype()));
  main_param_buffer_ = Tensor();
  for (auto& p : params_) p->main_param = Tensor();
  main_params_released_ = true;
}

void ParamAndGradBuffer::zero_grad() {
  if (!overwrite_main_grad_) {
    grad_buffer_.zero_();
    return;
  }
  for (auto& p : params_) p->grad_stale = true;
}

// Sorted by (buffer, offset): each run of adjacent stale parameters in one buffer is one fill.
void ParamAndGradBuffer::zero_stale(std::vector<Parameter*> ps) {
  std::erase_if(ps, [](const Parameter* p) { return !p || !p->grad_stale; });
  if (ps.empty()) return;
  std::sort(ps.begin(), ps.end(), [](const Parameter* a, const Parameter* b) {
    return std::tie(a->buffer, a->offset) < std::tie(b->buffer, b->offset);
  });
  size_t i = 0;
  while (i < ps.size()) {
    ParamAndGradBuffer* buf = ps[i]->buffer;
    const int64_t begin = ps[i]->offset;
    int64_t end = begin + ps[i]->main_grad.numel();
    size_t j = i + 1;
    for (; j < ps.size() && ps[j]->buffer == buf && ps[j]->offset == end; ++j) end += ps[j]->main_grad.numel();
    if (buf) {
      buf->grad_buffer().flat_slice(begin, {end - begin}).zero_();
      buf->stale_grads_zeroed_ += end - begin;
    } else {
      for (size_t q = i; q < j; ++q) ps[q]->main_grad.zero_();
    }
    for (size_t q = i; q < j; ++q) ps[q]->grad_stale = false;
    i = j;
  }
}

void ParamAndGradBuffer::zero_stale_grads() {
  std::vector<Parameter*> ps;
  for (auto& p : params_) ps.push_back(p.get());
  zero_stale(std::move(ps));
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
  ParamAndGradBuffer::zero_stale(std::vector<Parameter*>(params));
}

bool counts_in_grad_norm(const ParamSpec& spec, int tp_rank) {
  return !spec.shared_copy && (spec.shard.partitioned() || tp_rank == 0);
}

void Parameter::grad_ready() {
  MCPP_CHECK(!grad_stale, "parameter '{}' reported grad ready but its main_grad was never written this step (a "
             "backward wrote it without take_grad_overwrite / materialize_grads)", spec.key);
  if (buffer && buffer->grad_ready_hook()) buffer->grad_ready_hook()(*this);
}

}  // namespace mcpp
