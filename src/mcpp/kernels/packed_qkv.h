// Shape of the packed attention ops (flash_attention_{fwd,bwd}_qkv, kernels/ops.inc), shared by the CPU
// and CUDA backends: Megatron's fused linear_qkv output
//   qkv[s, b, ng * (r + 2) * d], per query group g the rows [q_0 .. q_{r-1}, k, v], each d wide, r = nq / ng
// (the qkv_split layout), with nq and d taken from o (fwd) / dout (bwd) [s, b, nq, d] and ng given.
// Every mismatch is an mcpp::Error naming the op and the argument. Also chunk_transpose's argument check.
#pragma once
#include <cstddef>
#include <cstdint>

#include "mcpp/core/error.h"
#include "mcpp/core/tensor.h"

namespace mcpp::ops::detail {

// chunk_transpose's arguments (both backends; the device is the caller's check): the bytes of one m-element
// block of in viewed as [a, c, m].
inline size_t chunk_transpose_block_bytes(const Tensor& out, const Tensor& in, int64_t a, int64_t c) {
  MCPP_CHECK(out.defined() && in.defined(), "chunk_transpose: out and in must be defined");
  MCPP_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel(),
             "chunk_transpose: out {} must have in's dtype and numel ({})", out.str(), in.str());
  MCPP_CHECK(a > 0 && c > 0 && in.numel() % (a * c) == 0, "chunk_transpose: {} is not [a={}, c={}, m]", in.str(), a,
             c);
  MCPP_CHECK(out.raw() != in.raw(), "chunk_transpose: out must not alias in");
  return static_cast<size_t>(in.numel() / (a * c)) * dtype_size(in.dtype());
}

struct PackedQkvDims {
  int64_t s, b, nq, ng, d;
  int64_t r() const { return nq / ng; }                       // query heads per group
  Shape q_shape() const { return {s, b, nq, d}; }
  Shape kv_shape() const { return {s, b, ng, d}; }
  Shape lse_shape() const { return {b, nq, s}; }
};

// heads: o (fwd) or dout (bwd), named `heads_name` in errors; qkv named "qkv" (or "dqkv" via qkv_name).
inline PackedQkvDims check_packed_qkv(const char* op, const char* qkv_name, const Tensor& qkv, const char* heads_name,
                                      const Tensor& heads, int64_t num_query_groups) {
  MCPP_CHECK(qkv.defined() && heads.defined(), "{}: {} and {} must be defined tensors", op, qkv_name, heads_name);
  MCPP_CHECK(heads.ndim() == 4 && heads.size(2) > 0 && heads.size(3) > 0,
             "{}: {} must be [s, b, nq, d] with nq, d > 0; got {}", op, heads_name, heads.str());
  const PackedQkvDims p{heads.size(0), heads.size(1), heads.size(2), num_query_groups, heads.size(3)};
  MCPP_CHECK(p.ng > 0 && p.nq % p.ng == 0,
             "{}: num_query_groups={} must be positive and divide the query heads nq={} of {} {}", op, p.ng, p.nq,
             heads_name, heads.str());
  const int64_t width = (p.nq + 2 * p.ng) * p.d;
  MCPP_CHECK(qkv.ndim() == 3 && qkv.size(0) == p.s && qkv.size(1) == p.b && qkv.size(2) == width,
             "{}: {} must be [s, b, (nq + 2 ng) d] = [{}, {}, {}] (nq={}, d={} from {}, ng={}); got {}", op, qkv_name,
             p.s, p.b, width, p.nq, p.d, heads_name, p.ng, qkv.str());
  return p;
}

}  // namespace mcpp::ops::detail
