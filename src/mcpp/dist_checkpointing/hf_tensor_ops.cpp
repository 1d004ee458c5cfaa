// fp32 CPU row rearrangements for the HF converters; see hf_tensor_ops.h.
#include "mcpp/dist_checkpointing/hf_tensor_ops.h"

#include <cstring>

#include "mcpp/core/error.h"

namespace mcpp::dist_checkpointing::hf_detail {
namespace {

int64_t row_width(const Tensor& x) {
  MCPP_CHECK(x.ndim() >= 1, "row helpers need at least 1 dim, got {}", x.str());
  return x.size(0) == 0 ? 0 : x.numel() / x.size(0);
}

Shape with_rows(const Tensor& x, int64_t rows) {
  Shape s = x.shape();
  s[0] = rows;
  return s;
}

}  // namespace

Tensor transpose2d(const Tensor& x) {
  MCPP_CHECK(x.ndim() == 2 && x.dtype() == DType::F32 && x.is_cpu(), "transpose2d needs a CPU F32 matrix, got {}",
             x.str());
  const int64_t a = x.size(0), b = x.size(1);
  Tensor y = Tensor::empty({b, a});
  const float* src = x.data<float>();
  float* dst = y.data<float>();
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) dst[j * a + i] = src[i * b + j];
  return y;
}

Tensor slice_rows(const Tensor& x, int64_t start, int64_t count) {
  MCPP_CHECK(start >= 0 && count >= 0 && start + count <= x.size(0), "slice_rows [{}, {}) of {}", start,
             start + count, x.str());
  return x.narrow0(start, count).clone();
}

Tensor cat_rows(const std::vector<Tensor>& parts) {
  MCPP_CHECK(!parts.empty(), "cat_rows of nothing");
  int64_t rows = 0;
  for (const auto& p : parts) {
    MCPP_CHECK(p.dtype() == parts[0].dtype() && p.ndim() == parts[0].ndim() &&
                   row_width(p) == row_width(parts[0]),
               "cat_rows: {} does not match {}", p.str(), parts[0].str());
    rows += p.size(0);
  }
  Tensor y = Tensor::empty(with_rows(parts[0], rows), parts[0].dtype());
  char* dst = static_cast<char*>(y.raw());
  for (const auto& p : parts) {
    std::memcpy(dst, p.raw(), p.nbytes());
    dst += p.nbytes();
  }
  return y;
}

Tensor pad_rows(const Tensor& x, int64_t rows) {
  MCPP_CHECK(rows >= x.size(0), "pad_rows to {} rows of {}", rows, x.str());
  Tensor y = Tensor::zeros(with_rows(x, rows), x.dtype());
  std::memcpy(y.raw(), x.raw(), x.nbytes());
  return y;
}

std::array<Tensor, 3> split_qkv(const Tensor& qkv, int64_t nq, int64_t ng, int64_t d) {
  MCPP_CHECK(ng > 0 && nq % ng == 0 && qkv.size(0) == (nq + 2 * ng) * d,
             "split_qkv: {} rows for nq={} ng={} d={}", qkv.size(0), nq, ng, d);
  const int64_t per_group = nq / ng * d;  // q rows of one group
  std::vector<Tensor> q, k, v;
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t base = g * (per_group + 2 * d);
    q.push_back(qkv.narrow0(base, per_group));             // [nq/ng * d, ...]
    k.push_back(qkv.narrow0(base + per_group, d));         // [d, ...]
    v.push_back(qkv.narrow0(base + per_group + d, d));     // [d, ...]
  }
  return {cat_rows(q), cat_rows(k), cat_rows(v)};
}

Tensor merge_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t nq, int64_t ng, int64_t d) {
  MCPP_CHECK(ng > 0 && nq % ng == 0 && q.size(0) == nq * d && k.size(0) == ng * d && v.size(0) == ng * d,
             "merge_qkv: q {} k {} v {} for nq={} ng={} d={}", q.str(), k.str(), v.str(), nq, ng, d);
  const int64_t per_group = nq / ng * d;
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < ng; ++g) {
    parts.push_back(q.narrow0(g * per_group, per_group));
    parts.push_back(k.narrow0(g * d, d));
    parts.push_back(v.narrow0(g * d, d));
  }
  return cat_rows(parts);  // [(nq + 2 ng) d, ...]
}

}  // namespace mcpp::dist_checkpointing::hf_detail
