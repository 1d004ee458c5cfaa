// Linked in a build without CUDA: the GEMM tuner's queries (kernels/gemm_autotune.h). No GEMM ever runs
// on a GPU here, so nothing is tuned or recorded; the switch itself lives in kernels/gemm_autotune.cpp.
#include "mcpp/kernels/gemm_autotune.h"

namespace mcpp::ops::cuda {

std::vector<GemmTuneRecord> gemm_tune_records() { return {}; }
void reset_gemm_tuning() {}
int last_gemm_algo_index() { return -1; }

}  // namespace mcpp::ops::cuda
