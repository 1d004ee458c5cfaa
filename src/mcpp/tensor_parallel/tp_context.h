// What a module needs of tensor parallelism: the TP group (a value) and whether sequence parallelism is
// on. Taken from the ParallelContext when the model is built; with tp == 1 the group is a size-1
// communicator and every mapping is an identity.
#pragma once
#include "mcpp/comm/communicator.h"

namespace mcpp::tensor_parallel {

struct TPContext {
  comm::CommPtr group;
  bool sequence_parallel = false;
  bool comm_overlap = false;  // --tp-comm-overlap (sequence parallel only): ring all-gather + GEMM
  int size() const { return group->size(); }
  int rank() const { return group->rank(); }
};

}  // namespace mcpp::tensor_parallel
