// MpiCommunicator: the CPU-rank backend over OpenMPI, plus the process-level init / world / finalize.
//
// Contract:
//   - init_mpi(argc, argv) calls MPI_Init_thread asking for MPI_THREAD_MULTIPLE (the watchdog thread may
//     call MPI_Abort while the training thread waits in MPI); when the library only grants
//     MPI_THREAD_SERIALIZED or more it continues (mpi_thread_level() tells), below that it is an error.
//     It creates the bf16/fp16 reduction ops and the world communicator ("world", global ranks
//     0..N-1, one FlightRecorder per process of the given capacity). Calling it twice is an error.
//     world() returns that communicator (mcpp::Error before init_mpi). finalize_mpi() drops world(),
//     frees the ops and calls MPI_Finalize; stop any Watchdog first; groups still held stay valid
//     objects but must not communicate.
//   - Every op is non-blocking: MPI_Iallreduce, MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ibcast,
//     MPI_Ialltoallv, MPI_Isend/MPI_Irecv (one batch = one Work over all its requests), MPI_Ibarrier.
//     The Work keeps the tensors (and the all_to_all count arrays) alive until completion; Avg divides
//     by size when the Work completes (in the thread that waits / tests).
//   - In place: all_gather with `in` = this rank's chunk of `out` uses MPI_IN_PLACE; reduce_scatter with
//     `out` inside `in` (Megatron's bucket shard) reduces into a temporary copied over `out` on completion.
//   - Element counts and all_to_all displacements must fit MPI's int: larger is an mcpp::Error naming the
//     op and value. CPU tensors only (mcpp::Error otherwise).
//   - new_group uses MPI_Comm_create_group over the listed members (group order = list order).
//   - Every communicator owns a private MPI_Comm_dup for the --check-collectives fingerprint all-gather.
//   - Every MPI call goes through MCPP_MPI_CHECK (call site + rank in the error).
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // C API only (the deprecated C++ bindings warn under -Wextra)
#endif
#include <mpi.h>

#include <functional>

#include "mcpp/comm/communicator.h"
#include "mcpp/comm/flight_recorder.h"

namespace mcpp::comm {

struct MpiInitOptions {
  size_t recorder_capacity = FlightRecorder::kDefaultCapacity;
};

CommPtr init_mpi(int& argc, char**& argv, const MpiInitOptions& opts = {});
CommPtr init_mpi(const MpiInitOptions& opts = {});  // no command line for MPI to read
CommPtr world();
void finalize_mpi();
bool mpi_initialized_here();
int mpi_thread_level();  // MPI_THREAD_* granted by init_mpi
// The default watchdog abort action of the CLI: prints nothing, calls MPI_Abort(MPI_COMM_WORLD, code).
std::function<void(int, const std::string&)> mpi_abort_action();

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor unless MPI is already finalized).
  MpiCommunicator(std::string name, std::vector<int> global_ranks, int rank, std::shared_ptr<FlightRecorder> recorder,
                  MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<int>& global_ranks) override;
  MPI_Comm mpi_comm() const { return comm_; }

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
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm check_comm_ = MPI_COMM_NULL;
};

}  // namespace mcpp::comm
