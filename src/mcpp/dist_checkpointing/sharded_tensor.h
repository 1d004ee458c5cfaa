// Sharded tensors: a rectangle of a logical (layout-independent) tensor, and the geometry around it.
//
// Contract:
//   Rect{offset, shape}: the elements offset[d] <= i_d < offset[d] + shape[d] of a row-major tensor.
//   ShardedTensor: key + global shape + a Rect of it + the rect's bytes (a contiguous CPU tensor of
//     shape rect.shape) — one manifest entry of a sharded checkpoint.
//   tp_shard_rects(local_shape, shard): the parameter's TP shard as (local rect, global rect) pairs,
//     one per ShardSegment (SwiGLU fc1 has two: gate and up halves), or one whole pair when replicated.
//   flat_range_rects(shape, begin, end): the flat range [begin, end) of a row-major tensor of `shape`
//     as at most 2*ndim-1 disjoint rectangles (partial first row, full middle block, partial last row,
//     recursively) — how a distributed-optimizer piece (a flat range of the TP-LOCAL tensor) becomes
//     global rectangles: flat range -> local rects -> intersected with each TP segment -> global rects.
//   copy_rect: copies an N-d box between two contiguous row-major buffers of the same element size.
// All pure CPU; no communication.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"
#include "mcpp/core/parameter.h"

namespace mcpp::dist_checkpointing {

struct Rect {
  Shape offset;
  Shape shape;
  int64_t numel() const { return shape_numel(shape); }
  bool operator==(const Rect& o) const { return offset == o.offset && shape == o.shape; }
};

// Intersection of two rects of the same rank; nullopt when empty.
std::optional<Rect> intersect(const Rect& a, const Rect& b);

struct ShardedTensor {
  std::string key;
  Shape global_shape;
  Rect rect;    // where `data` sits in the logical tensor
  Tensor data;  // [rect.shape], contiguous CPU
};

struct LocalGlobalRect {
  Rect local;   // in the TP-local tensor
  Rect global;  // in the logical tensor
};
// The TP shard's rects (segments in order); replicated params give one pair with local == global.
std::vector<LocalGlobalRect> tp_shard_rects(const Shape& local_shape, const TensorShard& shard);

// [begin, end) of the row-major flattening of `shape` as disjoint rects, in flat order.
std::vector<Rect> flat_range_rects(const Shape& shape, int64_t begin, int64_t end);

// Maps a rect of the TP-local tensor to global rects (split at segment boundaries along partition_dim).
std::vector<LocalGlobalRect> local_rect_to_global(const Rect& local, const Shape& local_shape,
                                                  const TensorShard& shard);

// Copies the box `extent` from src (row-major, shape src_shape) at src_at to dst (dst_shape) at dst_at.
void copy_rect(void* dst, const Shape& dst_shape, const Shape& dst_at, const void* src, const Shape& src_shape,
               const Shape& src_at, const Shape& extent, size_t elem_size);

// A contiguous CPU copy of the rect `r` of `t` (contiguous CPU).
Tensor extract_rect(const Tensor& t, const Rect& r);

}  // namespace mcpp::dist_checkpointing
