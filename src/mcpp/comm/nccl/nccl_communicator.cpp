// NcclCommunicator: NCCL collectives on a per-group comm stream, ordered after the compute stream by
// events; Work = the completion event; new_group / init_nccl bootstrap the unique id over MPI.
#include "mcpp/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/comm/nccl/nccl_check.h"
#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/device_clock.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/cuda/cuda_check.h"

namespace mcpp::comm {

namespace nccl {
namespace {
int g_rank = -1;
}
void set_error_rank(int global_rank) { g_rank = global_rank; }
void throw_nccl_error(ncclResult_t r, const char* call, const char* file, int line) {
  throw Error(fmt::format("NCCL error on rank {}: {} failed: {} ({}) ({}:{})", g_rank, call, ncclGetErrorString(r),
                          ncclGetLastError(nullptr), file, line));
}
}  // namespace nccl

namespace {

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
  }
  fail("NCCL backend: unsupported dtype {}", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  fail("NCCL backend: unsupported reduce op {}", static_cast<int>(op));
}

bool overlaps(const Tensor& a, const Tensor& b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.raw()), b0 = reinterpret_cast<uintptr_t>(b.raw());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

char* chunk(const Tensor& t, int i, size_t chunk_bytes) { return static_cast<char*>(t.raw()) + i * chunk_bytes; }

// Blocks the host until `ev` completed, polling so that a watchdog abort ends the wait with an error.
void host_wait_event(cudaEvent_t ev, const NcclWatchdog& wd) {
  for (;;) {
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) MCPP_CUDA_CHECK(q);
    wd.throw_if_fired();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

class NcclWork : public Work::Impl {
 public:
  NcclWork(std::shared_ptr<CudaEvent> done, std::vector<Tensor> keep, std::shared_ptr<NcclWatchdog> wd, bool host_wait)
      : done_(std::move(done)), keep_(std::move(keep)), wd_(std::move(wd)), host_wait_(host_wait) {}
  bool test() override {
    if (complete_) return true;
    wd_->throw_if_fired();
    cudaError_t q = cudaEventQuery(done_->ev);
    if (q == cudaErrorNotReady) return false;
    MCPP_CUDA_CHECK(q);
    complete_ = true;
    keep_.clear();  // finished on the GPU: the buffers may go
    return true;
  }
  void wait() override {
    if (complete_) return;
    wd_->throw_if_fired();
    // Later compute-stream work (kernels, copies, stream-ordered frees of keep_) runs after the op.
    MCPP_CUDA_CHECK(cudaStreamWaitEvent(cuda_detail::compute_stream(), done_->ev, 0));
    if (host_wait_) host_wait_event(done_->ev, *wd_);
    complete_ = true;
    keep_.clear();
  }

 private:
  std::shared_ptr<CudaEvent> done_;
  std::vector<Tensor> keep_;
  std::shared_ptr<NcclWatchdog> wd_;
  bool host_wait_;
  bool complete_ = false;
};

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

// Rank 0 of `boot` creates a unique id, everyone receives it over `boot` (a CPU communicator).
ncclUniqueId share_unique_id(Communicator& boot) {
  ncclUniqueId id;
  static_assert(sizeof(id) % sizeof(int32_t) == 0);
  Tensor buf = Tensor::zeros({static_cast<int64_t>(sizeof(id) / sizeof(int32_t))}, DType::I32);
  if (boot.rank() == 0) {
    MCPP_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(buf.raw(), &id, sizeof(id));
  }
  boot.broadcast(buf, 0).wait();
  std::memcpy(&id, buf.raw(), sizeof(id));
  return id;
}

}  // namespace

struct NcclCommunicator::Pending {
  std::shared_ptr<CudaEvent> done;
  std::vector<Tensor> keep;
  std::string what;
};

int nccl_version() {
  int v = 0;
  MCPP_NCCL_CHECK(ncclGetVersion(&v));
  return v;
}

CommPtr init_nccl(const CommPtr& mpi_world, int device, const NcclInitOptions& opts) {
  if (!mpi_world) fail("init_nccl: no MPI world communicator (call comm::init_mpi first)");
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (!nvls) {
    setenv("NCCL_NVLS_ENABLE", "0", 1);
  } else if (std::string(nvls) != "0") {
    fail("init_nccl: NCCL_NVLS_ENABLE={} — NVLink multicast must stay off (set NCCL_NVLS_ENABLE=0)", nvls);
  }
  nccl::set_error_rank(mpi_world->global_rank());
  int ndev = 0;
  MCPP_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (device < 0 || device >= ndev) {
    fail("init_nccl: device {} out of range on rank {} ({} CUDA devices visible)", device, mpi_world->global_rank(), ndev);
  }
  MCPP_CUDA_CHECK(cudaSetDevice(device));
  auto wd = std::make_shared<NcclWatchdog>(device, mpi_world->global_rank(), opts.watchdog);
  ncclUniqueId id = share_unique_id(*mpi_world);
  ncclComm_t c = nullptr;
  MCPP_NCCL_CHECK(ncclCommInitRank(&c, mpi_world->size(), id, mpi_world->rank()));
  // "nccl_world", not "world": the MPI world shares the recorder and keeps its own "world" seq numbers.
  return std::make_shared<NcclCommunicator>("nccl_world", mpi_world->global_ranks(), mpi_world->rank(),
                                            mpi_world->recorder_ptr(), c, mpi_world, std::move(wd));
}

NcclCommunicator::NcclCommunicator(std::string name, std::vector<int> global_ranks, int rank,
                                   std::shared_ptr<FlightRecorder> recorder, ncclComm* comm, CommPtr bootstrap,
                                   std::shared_ptr<NcclWatchdog> watchdog)
    : Communicator(std::move(name), std::move(global_ranks), rank, std::move(recorder)),
      comm_(comm),
      bootstrap_(std::move(bootstrap)),
      watchdog_(std::move(watchdog)) {
  if (!comm_ || !bootstrap_ || !watchdog_) fail("NcclCommunicator '{}': missing comm, bootstrap or watchdog", this->name());
  if (bootstrap_->global_ranks() != this->global_ranks()) {
    fail("NcclCommunicator '{}': bootstrap group '{}' has other members", this->name(), bootstrap_->name());
  }
  int nranks = 0;
  MCPP_NCCL_CHECK(ncclCommCount(comm_, &nranks));
  if (nranks != size()) fail("NcclCommunicator '{}': NCCL communicator has {} ranks, group lists {}", this->name(), nranks, size());
  cudaStream_t s = nullptr;
  MCPP_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  barrier_buf_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
  watchdog_->add_comm(comm_, this->name());
}

NcclCommunicator::~NcclCommunicator() {
  if (!watchdog_->fired()) cudaStreamSynchronize(stream_);  // the watchdog bounds this wait
  bool aborted = watchdog_->remove_comm(comm_);
  if (!aborted) ncclCommDestroy(comm_);
  cudaStreamDestroy(stream_);
}

std::string NcclCommunicator::describe(const char* op, const Tensor* t, uint64_t seq, bool p2p) const {
  std::string s = fmt::format("{} (group '{}' ranks [{}], {} {}", op, name(), join(global_ranks()), p2p ? "p2p_seq" : "seq", seq);
  if (t) s += fmt::format(", {}, {} elements", dtype_name(t->dtype()), t->numel());
  return s + ")";
}

NcclCommunicator::Pending NcclCommunicator::begin(const char* op, const std::vector<const Tensor*>& tensors) {
  watchdog_->throw_if_fired();
  Pending p;
  for (const Tensor* t : tensors) {
    if (t->device() != Device::CUDA) fail("{} on group '{}': the NCCL backend needs CUDA tensors, got {}", op, name(), t->str());
    p.keep.push_back(*t);
  }
  // Order the comm stream after everything already queued on the compute stream (the producers).
  CudaEvent ready;
  MCPP_CUDA_CHECK(cudaEventRecord(ready.ev, cuda_detail::compute_stream()));
  MCPP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready.ev, 0));
  p.done = std::make_shared<CudaEvent>();
  return p;
}

Work NcclCommunicator::post(Pending& p, const std::function<void()>& enqueue, bool host_wait) {
  // Under CUDA-graph capture (core/cuda_graph.h) the op is recorded, not run: its events belong to the
  // capture and cannot be polled, so the watchdog does not track it (nor its replays).
  const bool tracked = !stream_capturing();
  if (tracked) watchdog_->track(p.done, p.what);  // the host call itself may block (lazy connection setup)
  // Device timing (FlightRecorder::set_device_clock, the pipeline timeline): the op's span on the comm stream.
  DeviceClock* clock = tracked ? recorder()->device_clock() : nullptr;
  try {
    const int64_t start = clock ? clock->mark(Stream{stream_}) : -1;
    enqueue();
    if (clock) recorder()->set_device_marks(current_entry(), start, clock->mark(Stream{stream_}));
    MCPP_CUDA_CHECK(cudaEventRecord(p.done->ev, stream_));
  } catch (...) {
    if (tracked) watchdog_->untrack(p.done.get());
    throw;
  }
  if (tracked) watchdog_->mark_posted(p.done.get());
  return Work(std::make_unique<NcclWork>(p.done, std::move(p.keep), watchdog_, host_wait));
}

Work NcclCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  Pending p = begin("all_reduce", {&t});
  p.what = describe("all_reduce", &t, ++coll_seq_, false);
  return post(p, [&] {
    MCPP_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl_dtype(t.dtype()), nccl_op(op),
                                  comm_, stream_));
  }, /*host_wait=*/false);
}

Work NcclCommunicator::do_all_gather(Tensor& out, const Tensor& in) {
  if (overlaps(in, out) && in.raw() != chunk(out, rank(), in.nbytes())) {
    fail("all_gather on group '{}' (rank {}): in overlaps out but is not out's chunk {}", name(), rank(), rank());
  }
  Pending p = begin("all_gather", {&out, &in});
  p.what = describe("all_gather", &in, ++coll_seq_, false);
  return post(p, [&] {
    MCPP_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), static_cast<size_t>(in.numel()), nccl_dtype(in.dtype()), comm_,
                                  stream_));
  }, false);
}

Work NcclCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  // NCCL allows out == in's chunk `rank` (Megatron's bucket shard); any other overlap reduces into a
  // temporary that is copied over `out` on the comm stream.
  bool temp = overlaps(in, out) && out.raw() != chunk(in, rank(), out.nbytes());
  Tensor dst = temp ? Tensor::empty(out.shape(), out.dtype(), Device::CUDA) : out;
  Pending p = begin("reduce_scatter", {&out, &in, &dst});
  p.what = describe("reduce_scatter", &in, ++coll_seq_, false);
  return post(p, [&] {
    MCPP_NCCL_CHECK(ncclReduceScatter(in.raw(), dst.raw(), static_cast<size_t>(out.numel()), nccl_dtype(in.dtype()),
                                      nccl_op(op), comm_, stream_));
    if (temp) MCPP_CUDA_CHECK(cudaMemcpyAsync(out.raw(), dst.raw(), out.nbytes(), cudaMemcpyDeviceToDevice, stream_));
  }, false);
}

Work NcclCommunicator::do_broadcast(Tensor& t, int root) {
  Pending p = begin("broadcast", {&t});
  p.what = describe("broadcast", &t, ++coll_seq_, false);
  return post(p, [&] {
    MCPP_NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), static_cast<size_t>(t.numel()), nccl_dtype(t.dtype()), root, comm_,
                                  stream_));
  }, false);
}

// One ncclGroupStart/End around `body`; the group is closed even when a call inside throws.
static void grouped(const std::function<void()>& body) {
  MCPP_NCCL_CHECK(ncclGroupStart());
  try {
    body();
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  MCPP_NCCL_CHECK(ncclGroupEnd());
}

Work NcclCommunicator::do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                                     const std::vector<int64_t>& recv_counts) {
  if (overlaps(in, out)) fail("all_to_all on group '{}' (rank {}): in and out overlap", name(), rank());
  Pending p = begin("all_to_all", {&out, &in});
  p.what = describe("all_to_all", &in, ++coll_seq_, false);
  ncclDataType_t dt = nccl_dtype(in.dtype());
  size_t es = dtype_size(in.dtype());
  char* src = static_cast<char*>(in.raw());
  char* dst = static_cast<char*>(out.raw());
  return post(p, [&] {
    grouped([&] {
      int64_t soff = 0, roff = 0;
      for (int peer = 0; peer < size(); ++peer) {
        auto sc = send_counts[static_cast<size_t>(peer)], rc = recv_counts[static_cast<size_t>(peer)];
        if (sc > 0) MCPP_NCCL_CHECK(ncclSend(src + soff * es, static_cast<size_t>(sc), dt, peer, comm_, stream_));
        if (rc > 0) MCPP_NCCL_CHECK(ncclRecv(dst + roff * es, static_cast<size_t>(rc), dt, peer, comm_, stream_));
        soff += sc;
        roff += rc;
      }
    });
  }, false);
}

Work NcclCommunicator::do_batch_p2p(const std::vector<P2POp>& ops) {
  std::vector<const Tensor*> ts;
  for (const auto& o : ops) ts.push_back(&o.tensor);
  Pending p = begin("batch_p2p", ts);
  int64_t sent = 0;
  for (const auto& o : ops) sent += o.kind == P2POp::Kind::Send ? o.tensor.numel() : 0;
  p.what = fmt::format("batch_p2p (group '{}' ranks [{}], p2p_seq {}, {} ops, {} elements sent)", name(),
                       join(global_ranks()), ++p2p_seq_, ops.size(), sent);
  return post(p, [&] {
    grouped([&] {
      for (const auto& o : ops) {
        auto n = static_cast<size_t>(o.tensor.numel());
        ncclDataType_t dt = nccl_dtype(o.tensor.dtype());
        if (o.kind == P2POp::Kind::Send) {
          MCPP_NCCL_CHECK(ncclSend(o.tensor.raw(), n, dt, o.peer, comm_, stream_));
        } else {
          MCPP_NCCL_CHECK(ncclRecv(o.tensor.raw(), n, dt, o.peer, comm_, stream_));
        }
      }
    });
  }, false);
}

Work NcclCommunicator::do_barrier() {
  Pending p = begin("barrier", {&barrier_buf_});
  p.what = describe("barrier", nullptr, ++coll_seq_, false);
  return post(p, [&] {
    MCPP_NCCL_CHECK(ncclAllReduce(barrier_buf_.raw(), barrier_buf_.raw(), 1, ncclFloat32, ncclSum, comm_, stream_));
  }, /*host_wait=*/true);  // a barrier orders hosts: wait() blocks until every rank arrived
}

void NcclCommunicator::exchange_fingerprints(const int64_t* mine, int64_t* all, int n) {
  Tensor send = Tensor::empty({n}, DType::I64, Device::CUDA);
  Tensor recv = Tensor::empty({static_cast<int64_t>(n) * size()}, DType::I64, Device::CUDA);
  send.copy_from(Tensor::from_blob(const_cast<int64_t*>(mine), {n}, DType::I64));
  Pending p = begin("check_collectives", {&send, &recv});
  p.what = fmt::format("--check-collectives fingerprint all_gather (group '{}' ranks [{}])", name(), join(global_ranks()));
  post(p, [&] {
    MCPP_NCCL_CHECK(ncclAllGather(send.raw(), recv.raw(), static_cast<size_t>(n), ncclInt64, comm_, stream_));
  }, /*host_wait=*/true).wait();
  Tensor::from_blob(all, {static_cast<int64_t>(n) * size()}, DType::I64).copy_from(recv);
}

CommPtr NcclCommunicator::new_group(const std::string& name, const std::vector<int>& global_ranks) {
  auto mine = std::find(global_ranks.begin(), global_ranks.end(), global_rank());
  if (mine == global_ranks.end()) return nullptr;
  // The MPI subgroup checks membership in the parent and duplicates; it carries the unique id.
  CommPtr boot = bootstrap_->new_group(name + ".bootstrap", global_ranks);
  ncclUniqueId id = share_unique_id(*boot);
  int my_rank = static_cast<int>(mine - global_ranks.begin());
  ncclComm_t c = nullptr;
  MCPP_NCCL_CHECK(ncclCommInitRank(&c, static_cast<int>(global_ranks.size()), id, my_rank));
  auto g = std::make_shared<NcclCommunicator>(name, global_ranks, my_rank, recorder_ptr(), c, std::move(boot), watchdog_);
  g->set_check_collectives(check_collectives());
  return g;
}

}  // namespace mcpp::comm
