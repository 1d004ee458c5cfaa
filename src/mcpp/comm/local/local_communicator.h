// LocalCommunicator: the size-1, in-process backend, so single-process training runs the same code path
// (and the same flight recorder) as a multi-rank run without MPI.
//
// Contract: group of one (group rank 0, global rank 0 unless given). Every op completes immediately:
//   all_reduce: identity (avg divides by 1); all_gather / reduce_scatter / all_to_all: out = in (copy,
//   skipped when out and in are the same memory); broadcast: identity (root must be 0); batch_p2p: the
//   batch's sends to self are matched in order with its receives from self (copy), an unmatched send or
//   receive is an mcpp::Error (it would hang a real backend); barrier: no-op. new_group accepts only
//   {own global rank}. Works on any device the Tensor copy supports.
#pragma once
#include "mcpp/comm/communicator.h"

namespace mcpp::comm {

class LocalCommunicator : public Communicator {
 public:
  // A recorder is made when none is given (capacity FlightRecorder::kDefaultCapacity).
  explicit LocalCommunicator(std::string name = "world", std::shared_ptr<FlightRecorder> recorder = nullptr,
                             int global_rank = 0);
  std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<int>& global_ranks) override;
  bool takes_device_tensors() const override { return true; }

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
};

// The single-process world: a LocalCommunicator named "world" with its own recorder.
CommPtr make_local_world(size_t recorder_capacity = 2048);

}  // namespace mcpp::comm
