// MCPP_NCCL_CHECK(call): every NCCL call goes through it. On failure it throws mcpp::Error naming the
// call, NCCL's error string and last-error text, the call site and the global rank. ncclInProgress
// counts as success (non-blocking communicators are not used here, so it is never returned).
// Host-only header; include only from comm/nccl/*.cpp (it pulls in nccl.h).
#pragma once
#include <nccl.h>

namespace mcpp::comm::nccl {

[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* call, const char* file, int line);
void set_error_rank(int global_rank);  // the rank named in errors (set by init_nccl)

}  // namespace mcpp::comm::nccl

#define MCPP_NCCL_CHECK(call)                                                         \
  do {                                                                                \
    ncclResult_t mcpp_nccl_rc_ = (call);                                              \
    if (mcpp_nccl_rc_ != ncclSuccess && mcpp_nccl_rc_ != ncclInProgress) {            \
      ::mcpp::comm::nccl::throw_nccl_error(mcpp_nccl_rc_, #call, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)
