// NcclWatchdog: event polling + ncclCommGetAsyncError, ncclCommAbort on timeout or error.
#include "mcpp/comm/nccl/nccl_watchdog.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>

#include "mcpp/core/error.h"

namespace mcpp::comm {

CudaEvent::CudaEvent() {
  cudaEvent_t e = nullptr;
  cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (rc != cudaSuccess) fail("NCCL backend: cudaEventCreateWithFlags failed: {}", cudaGetErrorString(rc));
  ev = e;
}

CudaEvent::~CudaEvent() {
  if (ev) cudaEventDestroy(ev);
}

NcclWatchdog::NcclWatchdog(int device, int global_rank, NcclWatchdogOptions opts)
    : device_(device), rank_(global_rank), opts_(std::move(opts)) {
  if (!(opts_.timeout_seconds > 0)) fail("NCCL watchdog: timeout_seconds must be > 0, got {}", opts_.timeout_seconds);
  if (!(opts_.poll_seconds > 0)) fail("NCCL watchdog: poll_seconds must be > 0, got {}", opts_.poll_seconds);
  thread_ = std::thread([this] { loop(); });
}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void NcclWatchdog::add_comm(ncclComm* comm, const std::string& group) {
  std::lock_guard<std::mutex> lk(mu_);
  comms_.push_back(Live{comm, group});
}

bool NcclWatchdog::remove_comm(ncclComm* comm) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = std::find_if(comms_.begin(), comms_.end(), [&](const Live& l) { return l.comm == comm; });
  if (it == comms_.end()) return false;
  bool aborted = it->aborted;
  comms_.erase(it);
  return aborted;
}

void NcclWatchdog::track(std::shared_ptr<CudaEvent> done, std::string what) {
  std::lock_guard<std::mutex> lk(mu_);
  in_flight_.push_back(InFlight{std::move(done), std::move(what), std::chrono::steady_clock::now()});
}

void NcclWatchdog::mark_posted(const CudaEvent* done) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& f : in_flight_) {
    if (f.done.get() == done) f.posted = true;
  }
}

void NcclWatchdog::untrack(const CudaEvent* done) {
  std::lock_guard<std::mutex> lk(mu_);
  std::erase_if(in_flight_, [&](const InFlight& f) { return f.done.get() == done; });
}

bool NcclWatchdog::fired() const {
  std::lock_guard<std::mutex> lk(mu_);
  return !fired_line_.empty();
}

void NcclWatchdog::throw_if_fired() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (!fired_line_.empty()) throw Error(fired_line_);
}

std::string NcclWatchdog::poll_locked() {
  auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < in_flight_.size();) {
    // An op whose host call has not returned yet has no recorded event: only its age counts.
    cudaError_t q = in_flight_[i].posted ? cudaEventQuery(in_flight_[i].done->ev) : cudaErrorNotReady;
    if (q == cudaSuccess) {
      in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (q != cudaErrorNotReady) {
      return fmt::format("{} failed on the GPU: {}: {}", in_flight_[i].what, cudaGetErrorName(q), cudaGetErrorString(q));
    }
    double age = std::chrono::duration<double>(now - in_flight_[i].since).count();
    if (age > opts_.timeout_seconds) {
      return fmt::format("{} did not complete {}within {} s", in_flight_[i].what,
                         in_flight_[i].posted ? "on the GPU " : "(still blocked in its host NCCL call) ", opts_.timeout_seconds);
    }
    ++i;
  }
  for (const auto& l : comms_) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(l.comm, &async);
    if (rc != ncclSuccess) return fmt::format("ncclCommGetAsyncError on group '{}' failed: {}", l.group, ncclGetErrorString(rc));
    if (async != ncclSuccess && async != ncclInProgress) {
      return fmt::format("NCCL async error on group '{}': {} ({})", l.group, ncclGetErrorString(async),
                         ncclGetLastError(l.comm));
    }
  }
  return "";
}

void NcclWatchdog::fire_locked(const std::string& why) {
  int n = 0;
  for (auto& l : comms_) {
    if (l.aborted) continue;
    ncclCommAbort(l.comm);  // releases kernels stuck in this communicator's collectives
    l.aborted = true;
    ++n;
  }
  in_flight_.clear();
  fired_line_ = fmt::format("error: NCCL watchdog on rank {}: {}; aborted {} NCCL communicators", rank_, why, n);
}

void NcclWatchdog::loop() {
  if (cudaSetDevice(device_) != cudaSuccess) {
    std::lock_guard<std::mutex> lk(mu_);
    fired_line_ = fmt::format("error: NCCL watchdog on rank {}: cudaSetDevice({}) failed", rank_, device_);
    return;
  }
  auto period = std::chrono::duration<double>(opts_.poll_seconds);
  std::string line;
  {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, period, [&] { return stop_; });
      if (stop_) break;
      std::string why = poll_locked();
      if (why.empty()) continue;
      fire_locked(why);
      line = fired_line_;
      break;
    }
  }
  if (line.empty()) return;
  fmt::print(stderr, "{}\n", line);
  std::fflush(stderr);
  if (opts_.on_abort) opts_.on_abort(opts_.exit_code, line);
}

}  // namespace mcpp::comm
