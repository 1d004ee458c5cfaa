// MCPP_MPI_CHECK(call): every MPI call goes through it. On failure it throws mcpp::Error naming the call,
// the call site, the global rank and MPI's error string. Communicators use MPI_ERRORS_RETURN so failures
// reach this check instead of aborting inside MPI.
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // C API only (the deprecated C++ bindings warn under -Wextra)
#endif
#include <mpi.h>

#include <string>

namespace mcpp::comm::mpi {

int cached_world_rank();  // -1 before init_mpi
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);

}  // namespace mcpp::comm::mpi

#define MCPP_MPI_CHECK(call)                                                        \
  do {                                                                              \
    int mcpp_mpi_rc_ = (call);                                                      \
    if (mcpp_mpi_rc_ != MPI_SUCCESS) {                                              \
      ::mcpp::comm::mpi::throw_mpi_error(mcpp_mpi_rc_, #call, __FILE__, __LINE__);  \
    }                                                                               \
  } while (0)
