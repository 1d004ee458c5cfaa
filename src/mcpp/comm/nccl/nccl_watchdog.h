// NcclWatchdog: the GPU-side half of the watchdog for the NCCL backend (comm/watchdog.h is the
// host-side half, driven by the flight recorder). One per NCCL world, shared by all its groups.
//
// Contract:
//   - A background thread (bound to the world's CUDA device) polls every poll_seconds:
//       (a) each in-flight op's completion event (cudaEventQuery). An op is "in flight" from just before
//           its host NCCL call (which can itself block: NCCL connects channels lazily, on the host, in the
//           first collective / send-recv with a peer) until its event completes on the GPU — this is
//           independent of Work::wait(), which only orders the compute stream and returns at once, so
//           the flight recorder's "done" means "ordered", while this list means "finished on the GPU".
//       (b) ncclCommGetAsyncError on every live communicator of the world.
//   - An op in flight longer than timeout_seconds, an async NCCL error, or a CUDA error on an event
//     fires the watchdog ONCE: every live communicator is ncclCommAbort'ed (which releases kernels stuck in
//     a collective, so a host blocked in cudaStreamSynchronize / a copy returns), one line is printed on
//     stderr:
//       "error: NCCL watchdog on rank <r>: <op> (group '<g>' ranks [...], seq <s>, <dtype>, <n> elements)
//        did not complete on the GPU within <t> s; aborted <k> NCCL communicators"
//     and on_abort(exit_code, line) is called when given (the CLI passes comm::mpi_abort_action()).
//     Afterwards every NCCL call, Work::test and Work::wait on the world throws mcpp::Error with that line.
//   - Aborted communicators are never ncclCommDestroy'ed (NCCL forbids both); remove_comm tells.
//   - The destructor stops and joins the thread. Thread safety: all methods take the watchdog's mutex.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct ncclComm;
struct CUevent_st;

namespace mcpp::comm {

// A CUDA event created with timing disabled; destroyed with the last owner.
struct CudaEvent {
  CudaEvent();
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  CUevent_st* ev = nullptr;
};

struct NcclWatchdogOptions {
  double timeout_seconds = 600.0;  // per op, from enqueue to completion on the GPU
  double poll_seconds = 0.05;
  int exit_code = 3;
  std::function<void(int exit_code, const std::string& message)> on_abort = {};  // optional
};

class NcclWatchdog {
 public:
  NcclWatchdog(int device, int global_rank, NcclWatchdogOptions opts);
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  void add_comm(ncclComm* comm, const std::string& group);
  // Forgets `comm`; returns true when the watchdog aborted it (then it must not be destroyed).
  bool remove_comm(ncclComm* comm);
  // Before the host NCCL call of the op described by `what`: starts its clock (`done` not recorded yet).
  void track(std::shared_ptr<CudaEvent> done, std::string what);
  // After `done` was recorded on the comm stream: from now on its completion is polled.
  void mark_posted(const CudaEvent* done);
  // The host call failed (nothing was enqueued): forget the op.
  void untrack(const CudaEvent* done);
  bool fired() const;
  void throw_if_fired() const;  // mcpp::Error with the watchdog's line
  int device() const { return device_; }
  const NcclWatchdogOptions& options() const { return opts_; }

 private:
  struct InFlight {
    std::shared_ptr<CudaEvent> done;
    std::string what;
    std::chrono::steady_clock::time_point since;
    bool posted = false;
  };
  struct Live {
    ncclComm* comm;
    std::string group;
    bool aborted = false;
  };
  void loop();
  std::string poll_locked();  // "" when healthy, else why the watchdog fires
  void fire_locked(const std::string& why);

  int device_, rank_;
  NcclWatchdogOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<InFlight> in_flight_;
  std::vector<Live> comms_;
  std::string fired_line_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mcpp::comm
