// Tensor: shape + dtype + device over a shared Storage; owned, or a non-owning view (from_blob).
//
// Contract: tensors are always contiguous row-major. Views (view / narrow0 / flat_slice) share the
// storage and never copy. Device memory goes through core/device_memory.h so a CUDA build can allocate
// and copy on the GPU with the same Tensor type. Element access (data<T>) checks the dtype.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mcpp/core/dtype.h"

namespace mcpp {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

struct Storage {
  void* ptr = nullptr;
  size_t nbytes = 0;
  Device device = Device::CPU;
  bool owned = false;
  ~Storage();
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  // Non-owning view of caller memory (mmap'd data, a staging buffer). The caller keeps it alive.
  static Tensor from_blob(void* ptr, const Shape& shape, DType dtype, Device device = Device::CPU);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;  // negative d counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::CPU; }
  bool is_cpu() const { return device() == Device::CPU; }

  void* raw() const { return static_cast<char*>(storage_->ptr) + offset_bytes_; }
  template <typename T> T* data() const {
    check_type(sizeof(T), type_tag<T>());
    return static_cast<T*>(raw());
  }

  Tensor view(const Shape& shape) const;                      // one -1 allowed
  Tensor narrow0(int64_t start, int64_t length) const;        // rows [start, start+length) of dim 0
  Tensor flat_slice(int64_t offset, const Shape& shape) const;  // elements [offset, offset+numel(shape))
  bool same_storage(const Tensor& o) const { return storage_ == o.storage_; }

  Tensor clone() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;  // CPU only: fp32 <-> bf16/fp16, ints <-> ints
  void copy_from(const Tensor& src);  // same numel and dtype; any devices
  void zero_();
  void fill_(float value);  // fp32 only
  std::string str() const;  // "Tensor[float32, cpu, (2, 3)]"

 private:
  enum class Tag { Float, Half, I32, I64 };
  template <typename T> static constexpr Tag type_tag() {
    if constexpr (std::is_same_v<T, float>) return Tag::Float;
    else if constexpr (std::is_same_v<T, uint16_t>) return Tag::Half;
    else if constexpr (std::is_same_v<T, int32_t>) return Tag::I32;
    else { static_assert(std::is_same_v<T, int64_t>, "unsupported element type"); return Tag::I64; }
  }
  void check_type(size_t size, Tag tag) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
};

}  // namespace mcpp
