// Vocab-parallel cross entropy on the CPU, the way tensor_parallel/vocab_parallel.cpp runs it over TP
// ranks, with the ranks simulated here: each of 3 vocabulary slices gives its partials, the combine ops
// (local_lse -> MAX over slices -> rescale -> SUM over slices -> finish) give loss and lse equal to a
// float64 logsumexp over the whole row; targets in every slice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/grad_check.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

TEST(VocabParallelCeCpu, CombinedSlicesEqualTheWholeRowLogsumexp) {
  const int64_t n = 23, V = 3 * 40, slices = 3, Vl = V / slices;
  Tensor logits = testing::random_tensor({n, V}, 41, nullptr, -8.0, 8.0);
  Tensor targets = Tensor::empty({n}, DType::I32);
  for (int64_t r = 0; r < n; ++r) targets.data<int32_t>()[r] = static_cast<int32_t>((r * 37 + 5) % V);
  std::vector<Tensor> local_lse, target_logit;
  Tensor gmax = Tensor::empty({n});
  std::fill_n(gmax.data<float>(), n, -INFINITY);
  for (int64_t k = 0; k < slices; ++k) {  // each "rank": its slice's partials and logsumexp
    Tensor slice = Tensor::empty({n, Vl});
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(logits.data<float>() + r * V + k * Vl, Vl, slice.data<float>() + r * Vl);
    Tensor mx = Tensor::empty({n}), se = Tensor::empty({n}), tl = Tensor::empty({n}), ll = Tensor::empty({n});
    ops::vocab_parallel_ce_partials(mx, se, tl, slice, targets, k * Vl);
    ops::vocab_parallel_ce_local_lse(ll, mx, se);
    for (int64_t r = 0; r < n; ++r) gmax.data<float>()[r] = std::max(gmax.data<float>()[r], ll.data<float>()[r]);
    local_lse.push_back(ll);
    target_logit.push_back(tl);
  }
  Tensor sum_scaled = Tensor::zeros({n}), target = Tensor::zeros({n});
  for (int64_t k = 0; k < slices; ++k) {  // the SUM all-reduces
    Tensor scaled = Tensor::empty({n});
    ops::vocab_parallel_ce_rescale(scaled, local_lse[k], gmax);
    ops::add_inplace(sum_scaled, scaled);
    ops::add_inplace(target, target_logit[k]);
  }
  Tensor loss = Tensor::empty({n}), lse = Tensor::empty({n});
  ops::vocab_parallel_ce_finish(loss, lse, gmax, sum_scaled, target);
  for (int64_t r = 0; r < n; ++r) {
    const float* row = logits.data<float>() + r * V;
    const double m = *std::max_element(row, row + V);
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(row[j]) - m);
    const double want_lse = m + std::log(s), want_loss = want_lse - row[targets.data<int32_t>()[r]];
    EXPECT_NEAR(lse.data<float>()[r], want_lse, 2e-6 * std::abs(want_lse)) << "row " << r;
    EXPECT_NEAR(loss.data<float>()[r], want_loss, 4e-6 * std::max(1.0, std::abs(want_loss))) << "row " << r;
  }
}

}  // namespace
}  // namespace mcpp
