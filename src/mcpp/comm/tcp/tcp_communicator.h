// TcpCommunicator: a CPU backend of the Communicator interface over loopback TCP sockets, for processes
// started by `mcpp launch --nproc-per-node N` (apps/mcpp/launch.cpp) — the single-node launcher that needs
// no MPI (Megatron users' torchrun). Under `mcpp launch --device cuda`, the NCCL groups bootstrap over it
// and it carries the host values (Communicator::host()).
//
// Contract:
//   - Rendezvous through a directory (init_tcp_world): every rank listens on 127.0.0.1 (ephemeral port),
//     publishes "<dir>/rank_<r>" (written to a temp name, then renamed), waits for all N files, then the
//     ranks build a full mesh: rank i connects to every j < i (sending its rank), accepts every j > i.
//     A missing rank within timeout_seconds is an mcpp::Error naming the ranks that never published.
//   - Messages are framed {channel, nbytes}; a channel is (group, tag): collectives of a group use one
//     channel, batch_p2p uses the P2POp tag (0..15). Per peer and channel messages arrive in send order;
//     messages on other channels that arrive first are queued, so pipeline P2P and data-parallel
//     collectives between the same pair of ranks cannot be confused (the MPI backend's tags/communicators).
//   - Every op completes before it returns (Work is already done). Sends and receives of one op progress
//     together over poll() on non-blocking sockets, so symmetric exchanges of large buffers never
//     deadlock on full socket buffers.
//   - Algorithms (host tensors only; float32/bf16/f16/int32/int64): all_gather = every member sends its
//     chunk to every other; all_reduce = all_gather, then every rank reduces the members' values in group
//     rank order (float math in double, rounded once: identical results on every rank); reduce_scatter =
//     all_reduce + own chunk; broadcast from the root; all_to_all by counts; barrier = 1-byte all_gather.
//     Bandwidth is O(size) per element (fine on one node for host values and CPU-rank training; the GPU
//     path moves tensors through NCCL).
//   - new_group shares the world's sockets (channels keep groups apart). Threading: one thread issues calls.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mcpp/comm/communicator.h"

namespace mcpp::comm {

class TcpMesh;

class TcpCommunicator : public Communicator {
 public:
  TcpCommunicator(std::string name, std::vector<int> global_ranks, int rank, std::shared_ptr<FlightRecorder> recorder,
                  std::shared_ptr<TcpMesh> mesh);
  std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<int>& global_ranks) override;

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
  // Every member's `nbytes` bytes (mine included) in group rank order.
  std::vector<std::vector<char>> gather_bytes(const void* mine, size_t nbytes);
  uint64_t channel(int tag) const;
  std::shared_ptr<TcpMesh> mesh_;
  uint64_t group_id_;
};

struct TcpInitOptions {
  std::string rendezvous_dir;  // shared by the N processes (mcpp launch creates it), or tcp://HOST:PORT (multi-node)
  int rank = 0;
  int world_size = 1;
  double timeout_seconds = 120.0;
  // This process also serves the tcp:// rendezvous (rank 0 under srun, where no launcher serves it): a thread that
  // answers the ranks' registrations, then ends.
  bool serve_rendezvous = false;
};

// Collective over the N processes of the rendezvous: the "world" group (ranks 0..N-1).
CommPtr init_tcp_world(const TcpInitOptions& opts);

// The options from the environment `mcpp launch` sets (MCPP_LAUNCH_RDZV, MCPP_RANK, MCPP_WORLD_SIZE,
// MCPP_LAUNCH_RDZV_TIMEOUT), or, under Slurm's srun without MPI, from SLURM_PROCID / SLURM_NTASKS and torchrun's
// MASTER_ADDR / MASTER_PORT (rendezvous tcp://MASTER_ADDR:MASTER_PORT served by rank 0; MCPP_LAUNCH_RDZV_TIMEOUT
// applies too). launched_by_mcpp_launch(): whether either set is there.
bool launched_by_mcpp_launch();
TcpInitOptions tcp_options_from_env();

}  // namespace mcpp::comm
