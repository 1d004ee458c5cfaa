// attention_merge (ops.inc): fold one block of keys' flash attention result into a running one (the ring form of
// context parallelism merges cp blocks a query chunk). Per row (query i, sample bb, head h) of d values:
//   m = max(lse_acc, lse_blk), lse' = m + log(exp(lse_acc - m) + exp(lse_blk - m)),
//   o_acc' = o_acc exp(lse_acc - lse') + o_blk exp(lse_blk - lse');
// a row with lse_acc = -inf takes the block's values, one with lse_blk = -inf keeps its own. float32 throughout.
#include <cmath>
#include <limits>
#include <utility>

#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {

void attention_merge(Tensor& o_acc, Tensor& lse_acc, const Tensor& o_blk, const Tensor& lse_blk, Stream) {
  const char* op = "attention_merge";
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"o_acc", &o_acc}, {"lse_acc", &lse_acc},
                                {"o_blk", &o_blk}, {"lse_blk", &lse_blk}})
    detail::require_cpu_f32(op, name, *t);
  MCPP_CHECK(o_acc.ndim() == 4, "{}: o_acc must be [s, b, nq, d]; got {}", op, o_acc.str());
  detail::require_same_shape(op, "o_blk", o_blk, "o_acc", o_acc);
  const int64_t s = o_acc.size(0), b = o_acc.size(1), nq = o_acc.size(2), d = o_acc.size(3);
  MCPP_CHECK(lse_acc.shape() == Shape({b, nq, s}), "{}: lse_acc must be [b, nq, s] = [{}, {}, {}]; got {}", op, b,
             nq, s, lse_acc.str());
  detail::require_same_shape(op, "lse_blk", lse_blk, "lse_acc", lse_acc);
  float* po = o_acc.data<float>();
  float* pl = lse_acc.data<float>();
  const float* pb = o_blk.data<float>();
  const float* plb = lse_blk.data<float>();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) if (s * b * nq * d > (1 << 16))
  for (int64_t row = 0; row < s * b * nq; ++row) {  // row = (i * b + bb) * nq + h
    const int64_t i = row / (b * nq), bh = row % (b * nq);
    float& l = pl[bh * s + i];
    const float lb = plb[bh * s + i];
    float* o = po + row * d;
    const float* ob = pb + row * d;
    if (lb == kNegInf) continue;  // the block saw no keys for this row
    if (l == kNegInf) {
      for (int64_t j = 0; j < d; ++j) o[j] = ob[j];
      l = lb;
      continue;
    }
    const float m = std::max(l, lb);
    const float merged = m + std::log(std::exp(l - m) + std::exp(lb - m));
    const float a = std::exp(l - merged), c = std::exp(lb - merged);
    for (int64_t j = 0; j < d; ++j) o[j] = o[j] * a + ob[j] * c;
    l = merged;
  }
}

}  // namespace mcpp::ops::cpu
