#include "mcpp/tensor_parallel/fp8_recompute.h"

#include "mcpp/core/error.h"

namespace mcpp::tensor_parallel {

void Fp8ScaleStash::push(const void* owner, const Tensor& x_scale, const Tensor& w_scale) {
  entries_.push_back({.owner = owner, .x_scale = x_scale, .w_scale = w_scale});
}

const Fp8ScaleStash::Entry& Fp8ScaleStash::take(const void* owner, const std::string& name) {
  MCPP_CHECK(next_ < entries_.size(),
             "{}: the FP8 recompute re-run has more FP8 linear calls than its first forward recorded ({})", name,
             entries_.size());
  const Entry& e = entries_[next_];
  MCPP_CHECK(e.owner == owner,
             "{}: the FP8 recompute re-run calls its FP8 linears in another order than its first forward (entry {})",
             name, next_);
  ++next_;
  return e;
}

Fp8Recompute Fp8Recompute::recording(const Fp8Recompute* outer, Fp8ScaleStash& stash) {
  Fp8Recompute r = outer ? *outer : Fp8Recompute{};
  r.record.push_back(&stash);
  return r;
}

}  // namespace mcpp::tensor_parallel
