// What a module needs of tensor parallelism: the TP group (a value) and whether sequence parallelism is
// on — and of context parallelism, its group (the attention's all-to-all, the loss, the positions), and of
// expert model / tensor parallelism, their groups (the MoE layers' token dispatcher and experts). Taken
// from the ParallelContext when the model is built; with tp == 1 the group is a size-1 communicator and
// every mapping is an identity.
#pragma once
#include "mcpp/comm/communicator.h"

namespace mcpp::tensor_parallel {

struct TPContext {
  comm::CommPtr group;
  bool sequence_parallel = false;
  bool comm_overlap = false;  // --tp-comm-overlap (sequence parallel only): ring all-gather + GEMM
  // The context-parallel group (--context-parallel-size; all-to-all form, mappings.h all_to_all_cp2hp: each
  // rank holds a contiguous s / cp chunk of the sequence and the attention trades it for heads). Null: no CP.
  comm::CommPtr cp{};
  // --cp-comm-type p2p: the attention is the ring form (transformer/ring_attention.h) and each CP rank holds the
  // load-balanced chunks r and 2cp-1-r of the sequence (transformer/context_parallel.h) instead of chunk r of cp.
  bool cp_p2p = false;
  // The expert-model-parallel group (--expert-model-parallel-size; transformer/moe/token_dispatcher.h): each rank holds
  // num_moe_experts / ep of the experts, and the all-to-all dispatcher trades tokens over it. Null: EP 1.
  comm::CommPtr ep{};
  // The expert-tensor-parallel group (--expert-tensor-parallel-size; Megatron's default: the TP size): each routed
  // expert's fc1 / fc2 split over it like a dense MLP's, the dispatcher all-gathering the experts' input rows over
  // it and reduce-scattering their outputs. Null: expert TP 1 (every expert whole).
  comm::CommPtr etp{};
  int size() const { return group->size(); }
  int rank() const { return group->rank(); }
  int cp_size() const { return cp ? cp->size() : 1; }
  int cp_rank() const { return cp ? cp->rank() : 0; }
  int ep_size() const { return ep ? ep->size() : 1; }
  int ep_rank() const { return ep ? ep->rank() : 0; }
  int etp_size() const { return etp ? etp->size() : 1; }
};

}  // namespace mcpp::tensor_parallel
