// NumPy .npy v1.0 files (little-endian, C order) for float32 / int32 / int64 tensors: written by
// `mcpp forward --output logits.npy` and by tests that hand tensors to Python oracles; read back for tests.
#pragma once
#include <string>

#include "mcpp/core/tensor.h"

namespace mcpp {

void save_npy(const std::string& path, const Tensor& t);  // CPU tensor; throws mcpp::Error on I/O failure
Tensor load_npy(const std::string& path);                 // throws mcpp::Error naming the file

}  // namespace mcpp
