// MPI datatypes and reduction ops per mcpp DType.
//
// Contract: fp32 -> MPI_FLOAT, int32 -> MPI_INT32_T, int64 -> MPI_INT64_T with the built-in MPI ops;
// bf16 / fp16 travel as MPI_UINT16_T and reduce through user-defined commutative MPI_Ops (one per
// dtype x {sum, max, min}) that convert each pair to fp32, combine and round back to nearest-even.
// Avg is reduced as sum; the caller divides afterwards. create_reduce_ops() runs once in init_mpi,
// free_reduce_ops() before MPI_Finalize.
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // C API only (the deprecated C++ bindings warn under -Wextra)
#endif
#include <mpi.h>

#include "mcpp/comm/communicator.h"

namespace mcpp::comm::mpi {

MPI_Datatype mpi_datatype(DType t);
MPI_Op mpi_reduce_op(DType t, ReduceOp op);
void create_reduce_ops();
void free_reduce_ops();

}  // namespace mcpp::comm::mpi
