// Communicator (DESIGN.md decision 3): one interface for collectives and point-to-point, two backends
// (comm/mpi for CPU ranks, comm/nccl for GPUs). A Communicator is bound to one process group; groups are
// values (shared_ptr<Communicator>) passed explicitly to whoever communicates — no globals.
//
// Every call returns an owned Work handle (wait / test); a blocking call is `comm.x(...).wait()`.
// Destroying a Work that has not completed waits for it (MPI must not lose a request whose buffers are
// still in use); the watchdog bounds that wait. Tensors passed in are kept alive by the Work.
// Every call passes through the FlightRecorder (group name + member ranks, per-group sequence number,
// op, dtype, element count, start / end time, state queued -> started -> done, or failed when the call throws before it is posted) before the backend sees
// it, so a stuck or mismatched collective can be named (comm/watchdog.h). With check_collectives on,
// the ranks of the group first agree on a fingerprint (op, dtype, count, seq); a mismatch is an
// mcpp::Error naming both sides instead of a silent mis-sum.
//
// Semantics (all tensors contiguous, same dtype on every rank, on the backend's device):
//   all_reduce(t, op)               in place over the group
//   all_gather(out, in)             out = concat over ranks of in (rank order); out.numel = size * in.numel
//   reduce_scatter(out, in, op)     in.numel = size * out.numel; rank r gets chunk r of the reduction
//   broadcast(t, root)              root is a group rank
//   all_to_all(out, in, send_counts, recv_counts)   element counts per peer (variable splits)
//   batch_p2p(ops)                  a batch of sends / recvs to group ranks, completed together
//   barrier()
// In place is allowed where Megatron uses it: all_gather's `in` may be out's chunk `rank`, and
// reduce_scatter's `out` may be a view inside `in` (the bucket's own shard).
// ReduceOp::Avg is sum then divide by size, for float dtypes only (int dtypes: mcpp::Error).
// bf16 / fp16 reduce in the backend through an op that converts each pair to fp32 and rounds back (so a
// reduction rounds once per combining step, like NCCL's bf16 sums); other ops move them as raw 16-bit.
// Argument mistakes (dtype mismatch, wrong numel, root / peer out of range, counts not summing to numel)
// throw mcpp::Error naming the group, op and rank before anything is posted.
//
// Sequence numbers: seq counts this group's collectives (1, 2, ...); batch_p2p calls count separately
// (p2p_seq), since pipeline stages issue different numbers of them. Threading: one thread issues the
// calls of a communicator; the watchdog thread only reads the recorder.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp::comm {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

enum class OpType { AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll, BatchP2P, Barrier };
const char* op_type_name(OpType op);

class FlightRecorder;

// Completion handle of one communication call. Move-only; waiting twice is fine.
class Work {
 public:
  struct Impl {
    virtual ~Impl() = default;
    virtual bool test() = 0;  // non-blocking: true when complete
    virtual void wait() = 0;  // blocks until complete (the watchdog bounds how long)
  };
  Work() = default;
  explicit Work(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  bool test() { return !impl_ || impl_->test(); }
  void wait() {
    if (impl_) impl_->wait();
  }

 private:
  std::unique_ptr<Impl> impl_;
};

struct P2POp {
  enum class Kind { Send, Recv } kind;
  Tensor tensor;  // send: source; recv: destination (shape known by the receiver)
  int peer;       // group rank
  // Message channel (0..15): a send matches the receive with the same tag from the same peer, so two
  // streams between one pair of ranks (pipeline activations and gradients at pp = 2) cannot cross.
  int tag = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  const std::string& name() const { return name_; }             // "tp", "dp", "pp", "world", ...
  int rank() const { return rank_; }                            // rank within the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& global_ranks() const { return ranks_; }  // member global ranks, group order
  int global_rank() const { return ranks_[static_cast<size_t>(rank_)]; }

  [[nodiscard]] Work all_reduce(Tensor& t, ReduceOp op);
  [[nodiscard]] Work all_gather(Tensor& out, const Tensor& in);
  [[nodiscard]] Work reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op);
  [[nodiscard]] Work broadcast(Tensor& t, int root);
  [[nodiscard]] Work all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                                const std::vector<int64_t>& recv_counts);
  [[nodiscard]] Work batch_p2p(const std::vector<P2POp>& ops);
  [[nodiscard]] Work barrier();

  // A new communicator over `global_ranks` (a subset of this one's, in group order: the new group's rank
  // i is global_ranks[i]). Collective over the *listed members only*: every member calls with the same
  // name and list, and members create their groups in one canonical order (e.g. all ranks loop over all
  // groups in the same order, as Megatron does). A rank not in the list gets nullptr and communicates
  // nothing. Shares this communicator's flight recorder.
  virtual std::shared_ptr<Communicator> new_group(const std::string& name, const std::vector<int>& global_ranks) = 0;

  // The communicator for HOST tensors over the same members in the same order: this one for the CPU
  // backends (MPI, local); the NCCL backend's MPI bootstrap group (NCCL takes device tensors only). Used
  // for the few host values (loss sums, grad-norm partials, checkpoint votes) that travel between ranks.
  virtual Communicator& host() { return *this; }
  // Whether this backend moves device (CUDA) tensors itself: the local one (in-process, size 1) and NCCL do; MPI and
  // TCP take host tensors only, so a CUDA run bootstraps NCCL over them whatever their size (apps/mcpp/train.cpp).
  virtual bool takes_device_tensors() const { return false; }

  // --check-collectives: before each collective the group compares (op, dtype, count, seq, reduce op,
  // root) with a blocking all-gather on a private communicator; a mismatch throws mcpp::Error naming both
  // sides on every member. Must be set identically on every member. Not applied to batch_p2p.
  void set_check_collectives(bool on) { check_collectives_ = on; }
  bool check_collectives() const { return check_collectives_; }
  FlightRecorder* recorder() const { return recorder_.get(); }
  // Payload checksums: FlightRecorder::set_checksums (shared by every group of the rank).
  const std::shared_ptr<FlightRecorder>& recorder_ptr() const { return recorder_; }

 protected:
  Communicator(std::string name, std::vector<int> global_ranks, int rank, std::shared_ptr<FlightRecorder> recorder);

  // Backend hooks; called after recording (and the optional fingerprint check).
  virtual Work do_all_reduce(Tensor& t, ReduceOp op) = 0;
  virtual Work do_all_gather(Tensor& out, const Tensor& in) = 0;
  virtual Work do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) = 0;
  virtual Work do_broadcast(Tensor& t, int root) = 0;
  virtual Work do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                             const std::vector<int64_t>& recv_counts) = 0;
  virtual Work do_batch_p2p(const std::vector<P2POp>& ops) = 0;
  virtual Work do_barrier() = 0;
  // Fingerprint exchange for check_collectives: all-gather of a small fixed-size record, blocking.
  virtual void exchange_fingerprints(const int64_t* mine, int64_t* all, int n) = 0;
  // The flight-recorder id of the call being posted (valid inside the do_* hooks; device timing marks).
  uint64_t current_entry() const { return current_entry_; }

 private:
  struct CallInfo;
  Work run(const CallInfo& info, const std::function<Work()>& post);
  void check_fingerprint(const CallInfo& info);

  std::string name_;
  std::vector<int> ranks_;
  int rank_ = 0;
  std::shared_ptr<FlightRecorder> recorder_;
  uint64_t seq_ = 0;
  uint64_t p2p_seq_ = 0;
  uint64_t current_entry_ = 0;
  bool check_collectives_ = false;
};

using CommPtr = std::shared_ptr<Communicator>;

// Fault injection (--inject-fault corrupt-collective): the next all_reduce / all_gather / broadcast this process
// completes, on any group, has the lowest bit of its result's first byte flipped after the backend delivered it (a
// silent data corruption), before the flight recorder's result checksum. One-shot; thread-safe.
void arm_result_corruption();

}  // namespace mcpp::comm
