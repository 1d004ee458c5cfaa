#include "mcpp/distributed/param_and_grad_buffer.h"

#include <xxhash.h>

#include <cmath>
#include <unordered_set>

#include "mcpp/core/error.h"
#include "mcpp/core/rng.h"

namespace mcpp {

Parameter* ParamAndGradBuffer::add(ParamSpec spec) {
  MCPP_CHECK(!finalized_, "parameter '{}' registered after the buffer was finalized", spec.key);
  MCPP_CHECK(find(spec.key) == nullptr, "parameter key '{}' registered twice", spec.key);
  auto p = std::make_unique<Parameter>();
  p->spec = std::move(spec);
  params_.push_back(std::move(p));
  return params_.back().get();
}

Parameter* ParamAndGradBuffer::find(const std::string& key) const {
  for (const auto& p : params_)
    if (p->spec.key == key) return p.get();
  return nullptr;
}

void init_normal(Tensor& t, float std, uint64_t seed, const std::string& key) {
  const uint64_t stream = seed ^ XXH3_64bits(key.data(), key.size());
  float* out = t.data<float>();
  const int64_t n = t.numel();
  // Box-Muller on Philox draws: each 4x32 block gives two normals.
  for (int64_t i = 0; i < n; i += 2) {
    auto r = philox4x32_10(stream, static_cast<uint64_t>(i / 2), 0x5eedULL);
    double u1 = (static_cast<double>(r[0]) + 1.0) / 4294967297.0;  // (0, 1]
    double u2 = static_cast<double>(r[1]) / 4294967296.0;
    double rad = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * rad * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(std * rad * std::sin(2.0 * M_PI * u2));
  }
}

void ParamAndGradBuffer::finalize(uint64_t seed, Device device) {
  MCPP_CHECK(!finalized_, "ParamAndGradBuffer finalized twice");
  int64_t total = 0;
  for (const auto& p : params_) total += shape_numel(p->spec.shape);
  param_buffer_ = Tensor::zeros({total}, DType::F32, Device::CPU);
  grad_buffer_ = Tensor::zeros({total}, DType::F32, device);
  // Backward order: the last registered parameter (closest to the loss) sits at offset 0.
  int64_t offset = 0;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    Parameter& p = **it;
    const int64_t n = shape_numel(p.spec.shape);
    p.data = param_buffer_.flat_slice(offset, p.spec.shape);
    switch (p.spec.init) {
      case InitKind::Normal: init_normal(p.data, p.spec.std, seed, p.spec.key); break;
      case InitKind::Zeros: break;
      case InitKind::Ones: p.data.fill_(1.0f); break;
    }
    offset += n;
  }
  if (device != Device::CPU) param_buffer_ = param_buffer_.to(device);
  offset = 0;
  for (auto it = params_.rbegin(); it != params_.rend(); ++it) {
    Parameter& p = **it;
    p.data = param_buffer_.flat_slice(offset, p.spec.shape);
    p.main_grad = grad_buffer_.flat_slice(offset, p.spec.shape);
    offset += shape_numel(p.spec.shape);
  }
  finalized_ = true;
}

void ParamAndGradBuffer::zero_grad() { grad_buffer_.zero_(); }

}  // namespace mcpp
