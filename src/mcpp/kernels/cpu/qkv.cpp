// CPU qkv_split / qkv_merge (kernels/ops.inc): moves the rows of Megatron's fused QKV layout
//   qkv[s, b, ng * (r + 2) * d], per query group g: [q_0 .. q_{r-1}, k, v] (r = nq / ng)
// to and from q[s, b, nq, d], k/v[s, b, ng, d]. Pure data movement (memcpy of d-element rows), so any
// dtype works as long as all four tensors share it. Outputs overwritten. Also chunk_transpose (context
// parallelism's all-to-all layout), the same kind of row movement. qkv_split_rope / qkv_merge_rope: the split / merge
// composed with rope_fwd / rope_bwd on q and k (the reference the CUDA kernels equal).
#include <cstring>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/kernels/packed_qkv.h"

namespace mcpp::ops::cpu {
namespace {

struct QkvDims {
  int64_t sb, nq, ng, d, r;
};

QkvDims check_qkv(const char* op, const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"qkv", &qkv}, {"q", &q}, {"k", &k}, {"v", &v}}) {
    MCPP_CHECK(t->defined() && t->is_cpu(), "{}: {} must be a CPU tensor; got {}", op, name,
               t->defined() ? t->str() : "undefined");
    MCPP_CHECK(t->dtype() == qkv.dtype(), "{}: {} must have qkv's dtype; got {} and {}", op, name, t->str(), qkv.str());
  }
  MCPP_CHECK(q.ndim() == 4 && k.ndim() == 4, "{}: q and k must be [s, b, heads, d]; got {} and {}", op, q.str(), k.str());
  detail::require_same_shape(op, "v", v, "k", k);
  const QkvDims dm{q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), k.size(2) > 0 ? q.size(2) / k.size(2) : 0};
  MCPP_CHECK(k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == dm.d && dm.ng > 0 && dm.nq % dm.ng == 0,
             "{}: k {} does not match q {} (GQA needs nq a multiple of ng)", op, k.str(), q.str());
  MCPP_CHECK(qkv.numel() == dm.sb * (dm.nq + 2 * dm.ng) * dm.d && qkv.size(0) == q.size(0),
             "{}: qkv must be [s, b, (nq + 2 ng) d] = [{}, {}, {}]; got {}", op, q.size(0), q.size(1),
             (dm.nq + 2 * dm.ng) * dm.d, qkv.str());
  return dm;
}

// to_heads: qkv -> q, k, v; otherwise q, k, v -> qkv.
void move_rows(char* qkv, char* q, char* k, char* v, const QkvDims& dm, size_t elem, bool to_heads) {
  const size_t row = elem * static_cast<size_t>(dm.d);
  for (int64_t t = 0; t < dm.sb; ++t)
    for (int64_t g = 0; g < dm.ng; ++g) {
      char* grp = qkv + static_cast<size_t>((t * dm.ng + g) * (dm.r + 2)) * row;
      char* qd = q + static_cast<size_t>(t * dm.nq + g * dm.r) * row;
      char* kd = k + static_cast<size_t>(t * dm.ng + g) * row;
      char* vd = v + static_cast<size_t>(t * dm.ng + g) * row;
      if (to_heads) {
        std::memcpy(qd, grp, row * static_cast<size_t>(dm.r));
        std::memcpy(kd, grp + dm.r * row, row);
        std::memcpy(vd, grp + (dm.r + 1) * row, row);
      } else {
        std::memcpy(grp, qd, row * static_cast<size_t>(dm.r));
        std::memcpy(grp + dm.r * row, kd, row);
        std::memcpy(grp + (dm.r + 1) * row, vd, row);
      }
    }
}

char* bytes(const Tensor& t) { return static_cast<char*>(t.raw()); }

}  // namespace

void qkv_split(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, Stream) {
  const QkvDims dm = check_qkv("qkv_split", qkv, q, k, v);
  move_rows(bytes(qkv), bytes(q), bytes(k), bytes(v), dm, dtype_size(qkv.dtype()), /*to_heads=*/true);
}

void qkv_merge(Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, Stream) {
  const QkvDims dm = check_qkv("qkv_merge", qkv, q, k, v);
  move_rows(bytes(qkv), bytes(q), bytes(k), bytes(v), dm, dtype_size(qkv.dtype()), /*to_heads=*/false);
}

void qkv_split_rope(Tensor& q, Tensor& k, Tensor& v, const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                    Stream stream) {
  check_qkv("qkv_split_rope", qkv, q, k, v);
  qkv_split(q, k, v, qkv, stream);
  rope_fwd(q, q, cos, sin, stream);
  rope_fwd(k, k, cos, sin, stream);
}

void qkv_merge_rope(Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cos,
                    const Tensor& sin, Stream stream) {
  check_qkv("qkv_merge_rope", qkv, q, k, v);
  Tensor dq = Tensor::empty(q.shape(), q.dtype()), dk = Tensor::empty(k.shape(), k.dtype());
  rope_bwd(dq, q, cos, sin, stream);
  rope_bwd(dk, k, cos, sin, stream);
  qkv_merge(qkv, dq, dk, v, stream);
}

void chunk_transpose(Tensor& out, const Tensor& in, int64_t a, int64_t c, Stream) {
  const size_t m = ops::detail::chunk_transpose_block_bytes(out, in, a, c);
  MCPP_CHECK(out.is_cpu() && in.is_cpu(), "chunk_transpose: CPU tensors expected");
  const char* src = static_cast<const char*>(in.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < c; ++j) std::memcpy(dst + (j * a + i) * m, src + (i * c + j) * m, m);
}

}  // namespace mcpp::ops::cpu
