// NcclCommunicator: the GPU backend of the Communicator interface (DESIGN.md decision 3) over NCCL.
//
// Contract:
//   - Bootstrap under mpirun: init_nccl(mpi_world, device, opts) is collective over the MPI world. It
//     sets NCCL_NVLS_ENABLE=0 in the process environment when unset (NVLink multicast stays off; a value
//     other than 0 is an mcpp::Error), binds the process to CUDA `device`, lets world rank 0 create the
//     ncclUniqueId, broadcasts it over the MPI world and ncclCommInitRank's the NCCL world: group
//     "nccl_world" (not "world": it shares the MPI world's FlightRecorder — so the host-side comm::Watchdog
//     on the MPI world also sees NCCL calls — and the recorder tells groups apart by name and seq), the
//     same global ranks in the same order. It starts the world's NcclWatchdog.
//   - new_group(name, global_ranks): collective over the listed members only (the interface's rule).
//     The members make an MPI subgroup of the bootstrap communicator (MPI_Comm_create_group), its first
//     member creates a ncclUniqueId, broadcasts it over that subgroup, and all ncclCommInitRank — one
//     ncclComm per group, group rank i = global_ranks[i]. Create groups in one canonical order on every
//     rank (as Megatron does); the bootstrap broadcast shows up in the recorder as group "<name>.bootstrap".
//   - Streams: each group owns a non-blocking comm stream. Every op records a "ready" event on the
//     backend compute stream (kernels/cuda compute_stream(), where tensors are produced and freed), makes
//     the comm stream wait for it, enqueues the NCCL call(s) on the comm stream and records a "done" event
//     there. The host never blocks to post an op.
//   - Work = the done event. test() = cudaEventQuery. wait() makes the compute stream wait for the event
//     and returns without a host sync: later kernels, copies and (stream-ordered) frees of the tensors
//     run after the collective; a host read (Tensor::to(CPU)) syncs the compute stream and so sees the
//     result. Host sync only where the host itself needs the result: barrier().wait() and the
//     --check-collectives fingerprint exchange block the host until the event completes (polling, so a
//     watchdog abort surfaces as an mcpp::Error instead of a hang). The Work keeps its tensors alive.
//   - Ops: all_reduce (in place), all_gather (in place when `in` is out's chunk `rank`),
//     reduce_scatter (in place when `out` is in's chunk `rank`; another overlap goes through a
//     temporary), broadcast, all_to_all (variable counts: grouped ncclSend/ncclRecv, zero counts skipped),
//     batch_p2p (ncclGroupStart/End over the batch), barrier (a 1-element all_reduce). ReduceOp::Avg is
//     ncclAvg. dtypes: float32, bfloat16, float16 (bf16/fp16 reduce as NCCL does), int32, int64.
//   - CUDA tensors on the communicator's device only (a CPU tensor is an mcpp::Error naming op and group).
//   - Errors: every NCCL call goes through MCPP_NCCL_CHECK (call, NCCL's message, call site, rank).
//     The NcclWatchdog (nccl_watchdog.h) turns a stuck op or an async NCCL error into ncclCommAbort on
//     every group and an mcpp::Error on every later call.
//   - Lifetime: destroy the NCCL communicators before finalize_mpi(); the destructor syncs the comm
//     stream and ncclCommDestroy's (skipped for a communicator the watchdog aborted).
// Threading: one thread issues the calls of a world's communicators; the watchdog thread only polls.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mcpp/comm/communicator.h"
#include "mcpp/comm/nccl/nccl_watchdog.h"

struct ncclComm;
struct CUstream_st;

namespace mcpp::comm {

struct NcclInitOptions {
  NcclWatchdogOptions watchdog = {};
};

// Collective over `mpi_world` (a CPU communicator: the MPI world of init_mpi). `device` is the CUDA
// device of this rank (e.g. the node-local rank); the caller chooses it.
CommPtr init_nccl(const CommPtr& mpi_world, int device, const NcclInitOptions& opts);
int nccl_version();  // ncclGetVersion of the loaded library, e.g. 22809

class NcclCommunicator : public Communicator {
 public:
  // Takes ownership of `comm`. `bootstrap`: a CPU communicator over the same members in the same order.
  NcclCommunicator(std::string name, std::vector<int> global_ranks, int rank, std::shared_ptr<FlightRecorder> recorder,
                   ncclComm* comm, CommPtr bootstrap, std::shared_ptr<NcclWatchdog> watchdog);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<int>& global_ranks) override;
  Communicator& host() override { return *bootstrap_; }  // the MPI group the unique id came over
  bool takes_device_tensors() const override { return true; }
  ncclComm* nccl_comm() const { return comm_; }
  CUstream_st* comm_stream() const { return stream_; }
  const std::shared_ptr<NcclWatchdog>& watchdog() const { return watchdog_; }

 protected:
  Work do_all_reduce(Tensor& t, ReduceOp op) override;
  Work do_all_gather(Tensor& out, const Tensor& in) override;
  Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) override;
  Work do_broadcast(Tensor& t, int root) override;
  Work do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                     const std::vector<int64_t>& recv_counts) override;
  Work do_batch_p2p(const std::vector<P2POp>& ops) override;
  Work do_barrier() override;
  void exchange_fingerprints(const int64_t* mine, int64_t* all, int n) override;

 private:
  struct Pending;
  // Checks the tensors' device, orders the comm stream after the compute stream, makes the done event.
  Pending begin(const char* op, const std::vector<const Tensor*>& tensors);
  // Registers the op with the watchdog, runs `enqueue` (the NCCL calls on the comm stream), records the
  // done event and returns the Work; on a throw the op is unregistered again.
  Work post(Pending& p, const std::function<void()>& enqueue, bool host_wait);
  std::string describe(const char* op, const Tensor* t, uint64_t seq, bool p2p) const;

  ncclComm* comm_ = nullptr;
  CUstream_st* stream_ = nullptr;
  CommPtr bootstrap_;
  std::shared_ptr<NcclWatchdog> watchdog_;
  Tensor barrier_buf_;  // [1] float32 on the device, for barrier()
  uint64_t coll_seq_ = 0, p2p_seq_ = 0;  // mirror the front end's seq / p2p_seq for watchdog messages
};

}  // namespace mcpp::comm
