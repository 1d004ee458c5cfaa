// KV-cache generation checks shared by the CPU and CUDA model tests: the cached path's logits at every step against
// the full forward over the same tokens (its last row).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "mcpp/models/gpt/gpt_model.h"
#include "mcpp/transformer/inference_context.h"

namespace mcpp::testing {

// Row `row` of logits [n, Vp] as float32 on the host.
inline std::vector<float> host_row(const Tensor& logits, int64_t row) {
  Tensor r = logits.narrow0(row, 1).to(Device::CPU);
  if (r.dtype() != DType::F32) r = r.to(DType::F32);
  return {r.data<float>(), r.data<float>() + r.numel()};
}

// ||a - b|| / ||b||
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The next-token logits of the plain forward over ids (one sequence, no cache).
inline std::vector<float> full_forward_last_row(GPTModel& model, const std::vector<int32_t>& ids) {
  const auto s = static_cast<int64_t>(ids.size());
  Tensor tokens = Tensor::empty({s, 1}, DType::I32);
  std::copy(ids.begin(), ids.end(), tokens.data<int32_t>());
  GPTModelCtx ctx;
  return host_row(model.forward_logits(ctx, tokens, {.training = false}), s - 1);
}

// Prefills the prompts (right-padded, ragged) into an InferenceContext, then runs `steps` decode steps feeding each
// sequence its greedy token; after the prefill and after every step, each sequence's cached next-token logits are
// compared with full_forward_last_row over its tokens so far. Returns the largest relative L2 error of a row.
inline double cached_vs_full_logits(GPTModel& model, std::vector<std::vector<int32_t>> seqs, int64_t steps) {
  const auto b = static_cast<int64_t>(seqs.size());
  int64_t longest = 0;
  for (const auto& q : seqs) longest = std::max<int64_t>(longest, static_cast<int64_t>(q.size()));
  InferenceContext ic(b, longest + steps, model.device());
  Tensor tokens = Tensor::zeros({longest, b}, DType::I32);  // [s, b], pad id 0
  std::vector<int32_t> lengths;
  for (int64_t bb = 0; bb < b; ++bb) {
    for (size_t i = 0; i < seqs[bb].size(); ++i) tokens.data<int32_t>()[static_cast<int64_t>(i) * b + bb] = seqs[bb][i];
    lengths.push_back(static_cast<int32_t>(seqs[bb].size()));
  }
  double worst = 0;
  const int64_t vocab = model.config().vocab_size;
  auto check_and_extend = [&](const Tensor& logits, auto row_of) {
    for (int64_t bb = 0; bb < b; ++bb) {
      const std::vector<float> got = host_row(logits, row_of(bb)), want = full_forward_last_row(model, seqs[bb]);
      worst = std::max(worst, rel_l2(got, want));
      seqs[bb].push_back(static_cast<int32_t>(std::max_element(got.begin(), got.begin() + vocab) - got.begin()));
    }
  };
  GPTModelCtx ctx;
  check_and_extend(model.forward_logits(ctx, tokens, {.training = false, .inference = &ic}),
                   [&](int64_t bb) { return (lengths[bb] - 1) * b + bb; });
  for (int64_t st = 0; st < steps; ++st) {
    ic.set_lengths(lengths);
    Tensor step = Tensor::empty({1, b}, DType::I32);
    for (int64_t bb = 0; bb < b; ++bb) step.data<int32_t>()[bb] = seqs[bb].back();
    GPTModelCtx sctx;
    check_and_extend(model.forward_logits(sctx, step, {.training = false, .inference = &ic}),
                     [](int64_t bb) { return bb; });
    for (int32_t& l : lengths) ++l;
  }
  return worst;
}

}  // namespace mcpp::testing
