// Rect geometry of sharded tensors; see sharded_tensor.h.
#include "mcpp/dist_checkpointing/sharded_tensor.h"

#include <algorithm>
#include <cstring>

#include "mcpp/core/error.h"

namespace mcpp::dist_checkpointing {

std::optional<Rect> intersect(const Rect& a, const Rect& b) {
  MCPP_CHECK(a.offset.size() == b.offset.size(), "intersect: rank {} vs {}", a.offset.size(), b.offset.size());
  Rect r{Shape(a.offset.size()), Shape(a.offset.size())};
  for (size_t d = 0; d < a.offset.size(); ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (hi <= lo) return std::nullopt;
    r.offset[d] = lo;
    r.shape[d] = hi - lo;
  }
  return r;
}

std::vector<LocalGlobalRect> tp_shard_rects(const Shape& local_shape, const TensorShard& shard) {
  Rect whole{Shape(local_shape.size(), 0), local_shape};
  return local_rect_to_global(whole, local_shape, shard);
}

std::vector<LocalGlobalRect> local_rect_to_global(const Rect& local, const Shape& local_shape,
                                                  const TensorShard& shard) {
  if (!shard.partitioned()) return {{local, local}};
  const size_t pd = static_cast<size_t>(shard.partition_dim);
  MCPP_CHECK(pd < local_shape.size() && shard.global_shape.size() == local_shape.size(),
             "shard partition_dim {} does not fit local shape {}", pd, shape_str(local_shape));
  std::vector<LocalGlobalRect> out;
  for (const ShardSegment& seg : shard.segments) {
    const int64_t lo = std::max(local.offset[pd], seg.local_offset);
    const int64_t hi = std::min(local.offset[pd] + local.shape[pd], seg.local_offset + seg.length);
    if (hi <= lo) continue;
    LocalGlobalRect lg{local, local};
    lg.local.offset[pd] = lo;
    lg.local.shape[pd] = hi - lo;
    lg.global = lg.local;
    lg.global.offset[pd] = lo - seg.local_offset + seg.global_offset;
    out.push_back(lg);
  }
  return out;
}

namespace {
void flat_rects_rec(const Shape& shape, size_t dim, Shape prefix, int64_t begin, int64_t end,
                    std::vector<Rect>& out) {
  if (begin >= end) return;
  const size_t nd = shape.size();
  int64_t inner = 1;
  for (size_t d = dim + 1; d < nd; ++d) inner *= shape[d];
  auto make = [&](int64_t row0, int64_t rows) {  // rows [row0, row0+rows) of dim, everything inside
    Rect r{prefix, Shape(dim, 1)};
    r.offset.push_back(row0);
    r.shape.push_back(rows);
    for (size_t d = dim + 1; d < nd; ++d) {
      r.offset.push_back(0);
      r.shape.push_back(shape[d]);
    }
    out.push_back(r);
  };
  if (dim + 1 == nd) {  // innermost: a plain range
    make(begin, end - begin);
    return;
  }
  const int64_t first = begin / inner, last = (end - 1) / inner;
  if (first == last && !(begin % inner == 0 && end % inner == 0 && end - begin == inner)) {
    Shape p = prefix;
    p.push_back(first);
    flat_rects_rec(shape, dim + 1, p, begin - first * inner, end - first * inner, out);
    return;
  }
  int64_t full_lo = (begin + inner - 1) / inner, full_hi = end / inner;
  if (begin % inner != 0) {
    Shape p = prefix;
    p.push_back(first);
    flat_rects_rec(shape, dim + 1, p, begin - first * inner, inner, out);
  }
  if (full_hi > full_lo) make(full_lo, full_hi - full_lo);
  if (end % inner != 0) {
    Shape p = prefix;
    p.push_back(full_hi);
    flat_rects_rec(shape, dim + 1, p, 0, end - full_hi * inner, out);
  }
}
}  // namespace

std::vector<Rect> flat_range_rects(const Shape& shape, int64_t begin, int64_t end) {
  MCPP_CHECK(begin >= 0 && begin <= end && end <= shape_numel(shape), "flat range [{}, {}) outside {}", begin,
             end, shape_str(shape));
  std::vector<Rect> out;
  if (shape.empty()) {  // a scalar: one element
    if (end > begin) out.push_back({{}, {}});
    return out;
  }
  // The prefix rects carry offset and shape for the leading dims; flat_rects_rec fills both.
  flat_rects_rec(shape, 0, {}, begin, end, out);
  return out;
}

void copy_rect(void* dst, const Shape& dst_shape, const Shape& dst_at, const void* src, const Shape& src_shape,
               const Shape& src_at, const Shape& extent, size_t elem_size) {
  const size_t nd = extent.size();
  MCPP_CHECK(dst_shape.size() == nd && src_shape.size() == nd && dst_at.size() == nd && src_at.size() == nd,
             "copy_rect: rank mismatch");
  if (shape_numel(extent) == 0) return;
  if (nd == 0) {
    std::memcpy(dst, src, elem_size);
    return;
  }
  // Strides in elements; the innermost dim is copied as one run.
  std::vector<int64_t> ds(nd, 1), ss(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) {
    ds[d - 1] = ds[d] * dst_shape[d];
    ss[d - 1] = ss[d] * src_shape[d];
  }
  const size_t run = static_cast<size_t>(extent[nd - 1]) * elem_size;
  std::vector<int64_t> idx(nd, 0);  // over dims [0, nd-1)
  auto* d8 = static_cast<char*>(dst);
  const auto* s8 = static_cast<const char*>(src);
  while (true) {
    int64_t doff = 0, soff = 0;
    for (size_t d = 0; d < nd; ++d) {
      const int64_t i = d + 1 < nd ? idx[d] : 0;
      doff += (dst_at[d] + i) * ds[d];
      soff += (src_at[d] + i) * ss[d];
    }
    std::memcpy(d8 + doff * elem_size, s8 + soff * elem_size, run);
    size_t d = nd - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (nd == 1) return;
  }
}

Tensor extract_rect(const Tensor& t, const Rect& r) {
  Tensor out = Tensor::empty(r.shape, t.dtype(), Device::CPU);
  copy_rect(out.raw(), r.shape, Shape(r.shape.size(), 0), t.raw(), t.shape(), r.offset, r.shape,
            dtype_size(t.dtype()));
  return out;
}

}  // namespace mcpp::dist_checkpointing
