// NumPy .npy v1.0 files (little-endian, C order) for float32 / int32 / int64 tensors: written by
// `mcpp forward --output logits.npy` and by tests that hand tensors to Python oracles; read back for tests.
// NpyWriter streams an array too large to hold: the header for its shape, then parts appended in C order.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

#include "mcpp/core/tensor.h"

namespace mcpp {

void save_npy(const std::string& path, const Tensor& t);  // CPU tensor; throws mcpp::Error on I/O failure
Tensor load_npy(const std::string& path);                 // throws mcpp::Error naming the file

class NpyWriter {
 public:
  NpyWriter(const std::string& path, const Shape& shape, DType dtype);
  void append(const Tensor& t);  // the next numel(t) elements in C order (any shape; t's dtype)
  void close();                  // checks that every element was written
 private:
  std::string path_;
  DType dtype_;
  uint64_t remaining_;  // bytes still to append
  std::ofstream out_;
};

}  // namespace mcpp
