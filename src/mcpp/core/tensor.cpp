#include "mcpp/core/tensor.h"

#include <fmt/format.h>

#include <cstring>

#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"

namespace mcpp {

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + ")";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    MCPP_CHECK(d >= 0, "negative dimension in shape {}", shape_str(s));
    n *= d;
  }
  return n;
}

Storage::~Storage() {
  if (owned && ptr) device_free(ptr, device);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->nbytes = t.nbytes();
  t.storage_->device = device;
  t.storage_->owned = true;
  t.storage_->ptr = device_alloc(std::max<size_t>(t.storage_->nbytes, 1), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::from_blob(void* ptr, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>();
  t.storage_->ptr = ptr;
  t.storage_->nbytes = t.nbytes();
  t.storage_->device = device;
  t.storage_->owned = false;
  return t;
}

int64_t Tensor::size(int d) const {
  int n = ndim();
  if (d < 0) d += n;
  MCPP_CHECK(d >= 0 && d < n, "dim {} out of range for shape {}", d, shape_str(shape_));
  return shape_[static_cast<size_t>(d)];
}

void Tensor::check_type(size_t size, Tag tag) const {
  MCPP_CHECK(defined(), "access to an undefined tensor");
  bool ok = false;
  switch (dtype_) {
    case DType::F32: ok = tag == Tag::Float; break;
    case DType::BF16:
    case DType::F16: ok = tag == Tag::Half; break;
    case DType::I32: ok = tag == Tag::I32; break;
    case DType::I64: ok = tag == Tag::I64; break;
  }
  MCPP_CHECK(ok && size == dtype_size(dtype_), "element type does not match {}", str());
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MCPP_CHECK(infer < 0, "view: more than one -1 in {}", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MCPP_CHECK(known > 0 && numel_ % known == 0, "view {} incompatible with {}", shape_str(shape), str());
    s[static_cast<size_t>(infer)] = numel_ / known;
  }
  MCPP_CHECK(shape_numel(s) == numel_, "view {} incompatible with {}", shape_str(shape), str());
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::narrow0(int64_t start, int64_t length) const {
  MCPP_CHECK(ndim() >= 1 && start >= 0 && length >= 0 && start + length <= shape_[0],
             "narrow0({}, {}) out of range for {}", start, length, str());
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  Shape s = shape_;
  s[0] = length;
  return flat_slice(start * row, s);
}

Tensor Tensor::flat_slice(int64_t offset, const Shape& shape) const {
  int64_t n = shape_numel(shape);
  MCPP_CHECK(offset >= 0 && offset + n <= numel_, "flat_slice({}, {}) out of range for {}", offset,
             shape_str(shape), str());
  Tensor t = *this;
  t.shape_ = shape;
  t.numel_ = n;
  t.offset_bytes_ = offset_bytes_ + static_cast<size_t>(offset) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor t = empty(shape_, dtype_, d);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype_) return *this;
  MCPP_CHECK(is_cpu(), "Tensor::to(dtype) runs on CPU tensors; got {}", str());
  Tensor t = empty(shape_, dt, Device::CPU);
  auto is_float = [](DType x) { return x == DType::F32 || x == DType::BF16 || x == DType::F16; };
  if (is_float(dtype_) && is_float(dt)) {
    for (int64_t i = 0; i < numel_; ++i) {
      float f = dtype_ == DType::F32    ? data<float>()[i]
                : dtype_ == DType::BF16 ? bf16_to_f32(data<uint16_t>()[i])
                                        : f16_to_f32(data<uint16_t>()[i]);
      if (dt == DType::F32) t.data<float>()[i] = f;
      else if (dt == DType::BF16) t.data<uint16_t>()[i] = f32_to_bf16(f);
      else t.data<uint16_t>()[i] = f32_to_f16(f);
    }
  } else if (!is_float(dtype_) && !is_float(dt)) {
    for (int64_t i = 0; i < numel_; ++i) {
      int64_t v = dtype_ == DType::I32 ? data<int32_t>()[i] : data<int64_t>()[i];
      if (dt == DType::I32) t.data<int32_t>()[i] = static_cast<int32_t>(v);
      else t.data<int64_t>()[i] = v;
    }
  } else {
    fail("Tensor::to: no conversion from {} to {}", dtype_name(dtype_), dtype_name(dt));
  }
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  MCPP_CHECK(src.numel_ == numel_ && src.dtype_ == dtype_, "copy_from: {} <- {}", str(), src.str());
  if (numel_ == 0) return;
  device_memcpy(raw(), device(), src.raw(), src.device(), nbytes());
}

void Tensor::zero_() {
  if (numel_) device_memset_zero(raw(), device(), nbytes());
}

void Tensor::fill_(float value) {
  MCPP_CHECK(dtype_ == DType::F32 && is_cpu(), "fill_ needs a CPU float32 tensor, got {}", str());
  float* p = data<float>();
  for (int64_t i = 0; i < numel_; ++i) p[i] = value;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor[undefined]";
  return fmt::format("Tensor[{}, {}, {}]", dtype_name(dtype_), device_name(device()), shape_str(shape_));
}

}  // namespace mcpp
