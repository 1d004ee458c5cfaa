// CPU scaled (causal-)masked softmax — Megatron's fused_scale_mask_softmax for the unfused attention path.
//
// Contract:
//   scaled_masked_softmax_fwd: probs[rows, sq, sk] = softmax_k(scale * scores[rows, sq, sk]); with
//     causal, key j > query i is masked (probability exactly 0), which requires sq == sk (Megatron's
//     scaled_upper_triang_masked_softmax). Row max subtracted before exp; sum in float32.
//   scaled_masked_softmax_bwd: dscores = scale * probs * (dprobs - sum_k(dprobs * probs)) per row; masked
//     entries have probs == 0 and so get 0.
//   Outputs are OVERWRITTEN; float32 CPU tensors, 3-D. OpenMP over the rows*sq softmax rows.
#include <algorithm>
#include <cmath>
#include <limits>

#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
namespace {

void check_3d(const char* op, const char* field, const Tensor& t) {
  if (!t.defined() || !t.is_cpu() || t.dtype() != DType::F32 || t.ndim() != 3)
    fail("{}: {} must be a float32 CPU tensor [rows, sq, sk], got {}", op, field,
         t.defined() ? t.str() : "undefined");
}

void check_same(const char* op, const char* field, const Tensor& t, const Tensor& ref) {
  check_3d(op, field, t);
  if (t.shape() != ref.shape()) fail("{}: {} {} must match {}", op, field, t.str(), ref.str());
}

}  // namespace

void scaled_masked_softmax_fwd(Tensor& probs, const Tensor& scores, float scale, bool causal, Stream) {
  check_3d("scaled_masked_softmax_fwd", "scores", scores);
  check_same("scaled_masked_softmax_fwd", "probs", probs, scores);
  const int64_t rows = scores.size(0), sq = scores.size(1), sk = scores.size(2);
  if (causal && sq != sk)
    fail("scaled_masked_softmax_fwd: causal mask needs sq == sk, got scores {}", scores.str());
  const float* x = scores.data<float>();  // [rows, sq, sk]
  float* p = probs.data<float>();         // [rows, sq, sk]
  const int64_t nrows = rows * sq;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < nrows; ++r) {
    const int64_t i = r % sq;                  // query position
    const int64_t valid = causal ? i + 1 : sk;  // keys 0..valid-1 unmasked
    const float* xr = x + r * sk;
    float* pr = p + r * sk;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, scale * xr[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < valid; ++j) {
      pr[j] = std::exp(scale * xr[j] - mx);
      sum += pr[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < valid; ++j) pr[j] *= inv;
    for (int64_t j = valid; j < sk; ++j) pr[j] = 0.0f;
  }
}

void scaled_masked_softmax_bwd(Tensor& dscores, const Tensor& dprobs, const Tensor& probs, float scale, Stream) {
  check_3d("scaled_masked_softmax_bwd", "probs", probs);
  check_same("scaled_masked_softmax_bwd", "dprobs", dprobs, probs);
  check_same("scaled_masked_softmax_bwd", "dscores", dscores, probs);
  const int64_t sk = probs.size(2), nrows = probs.size(0) * probs.size(1);
  const float* p = probs.data<float>();    // [rows, sq, sk]
  const float* dp = dprobs.data<float>();  // [rows, sq, sk]
  float* ds = dscores.data<float>();       // [rows, sq, sk], may alias dprobs
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < nrows; ++r) {
    const float* pr = p + r * sk;
    const float* dpr = dp + r * sk;
    float* dsr = ds + r * sk;
    float dot = 0.0f;
    for (int64_t j = 0; j < sk; ++j) dot += dpr[j] * pr[j];
    for (int64_t j = 0; j < sk; ++j) dsr[j] = scale * pr[j] * (dpr[j] - dot);
  }
}

}  // namespace mcpp::ops::cpu
