// The grouped GEMMs whose group sizes are on the host (grouped_gemm_lt.cpp: cuBLASLt, one pointer-array batched GEMM
// when every group has the same rows, with the bias / GELU / gelu' epilogues of fwd / gelu_fwd / dgelu_bwd), called by
// grouped_gemm.cpp's ops for a host counts tensor. Shapes and dtypes are checked by the caller
// (ops::check_grouped_linear); counts: int64 [G] on the host, each >= 0, summing to the rows (checked here). Async on
// s. Not part of the kernel interface (kernels/ops.h): only src/mcpp/kernels/cuda includes this.
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp::ops::cuda::grouped_lt {

void fwd(Tensor& y, const Tensor& x, const std::vector<Tensor>& w, const std::vector<Tensor>& bias,
         const Tensor& counts, cudaStream_t s);
void gelu_fwd(Tensor& act, Tensor& pre_act, const Tensor& x, const std::vector<Tensor>& w,
              const std::vector<Tensor>& bias, const Tensor& counts, cudaStream_t s);
void dgrad(Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& counts, cudaStream_t s);
void dgelu_bwd(Tensor& dpre, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& pre_act,
               const Tensor& counts, cudaStream_t s);
void wgrad(std::vector<Tensor>& dw_acc, std::vector<Tensor>& db_acc, const Tensor& dy, const Tensor& x,
           const Tensor& counts, bool overwrite, cudaStream_t s);

}  // namespace mcpp::ops::cuda::grouped_lt
