#include "mcpp/transformer/packed_seq_params.h"

#include "mcpp/core/error.h"

namespace mcpp {

PackedSeqParams PackedSeqParams::to_device(Device device) const {
  auto move = [&](const Tensor& t) { return !t.defined() || t.device() == device ? t : t.to(device); };
  return {move(position_ids), move(doc_start)};
}

PackedSeqParams packed_seq_params_from_cu_seqlens(const std::vector<std::vector<int32_t>>& cu_seqlens, int64_t s,
                                                  const PackedSeqOptions& opt) {
  const auto b = static_cast<int64_t>(cu_seqlens.size());
  MCPP_CHECK(b > 0 && s > 0, "packed sequences: need at least one sample of positive length (b={}, s={})", b, s);
  PackedSeqParams p;
  if (opt.reset_position_ids) p.position_ids = Tensor::empty({s, b}, DType::I32);  // [s, b]
  if (opt.reset_attention_mask) p.doc_start = Tensor::empty({b, s}, DType::I32);   // [b, s]
  for (int64_t ib = 0; ib < b; ++ib) {
    const std::vector<int32_t>& cu = cu_seqlens[static_cast<size_t>(ib)];
    MCPP_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == s,
               "packed sequences: sample {}'s cu_seqlens must run from 0 to the sequence length {} (got {} entries, "
               "{} .. {})",
               ib, s, cu.size(), cu.empty() ? -1 : cu.front(), cu.empty() ? -1 : cu.back());
    for (size_t k = 0; k + 1 < cu.size(); ++k) {
      MCPP_CHECK(cu[k] < cu[k + 1], "packed sequences: sample {}'s cu_seqlens[{}] = {} is not below the next entry {}",
                 ib, k, cu[k], cu[k + 1]);
      for (int32_t i = cu[k]; i < cu[k + 1]; ++i) {
        if (p.position_ids.defined()) p.position_ids.data<int32_t>()[i * b + ib] = i - cu[k];
        if (p.doc_start.defined()) p.doc_start.data<int32_t>()[ib * s + i] = cu[k];
      }
    }
  }
  return p;
}

std::vector<std::vector<int32_t>> cu_seqlens_from_eod(const Tensor& tokens, int64_t eod_token) {
  MCPP_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::I32 && tokens.is_cpu(),
             "packed sequences: tokens must be int32 [s, b] on the host; got {}", tokens.str());
  const int64_t s = tokens.size(0), b = tokens.size(1);
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(b));
  for (int64_t ib = 0; ib < b; ++ib) {
    std::vector<int32_t>& cu = out[static_cast<size_t>(ib)];
    cu.push_back(0);
    for (int64_t i = 0; i + 1 < s; ++i)  // an EOD in the last position ends the sample anyway
      if (tokens.data<int32_t>()[i * b + ib] == eod_token) cu.push_back(static_cast<int32_t>(i + 1));
    cu.push_back(static_cast<int32_t>(s));
  }
  return out;
}

}  // namespace mcpp
