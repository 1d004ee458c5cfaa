// MpiCommunicator: non-blocking MPI collectives wrapped in Work; new_group via MPI_Comm_create_group.
#include "mcpp/comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <climits>

#include "mcpp/comm/mpi/mpi_check.h"
#include "mcpp/comm/mpi/mpi_reduce_ops.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {

namespace {

constexpr int kP2PTag = 7;

// One Work over a set of MPI requests; runs `on_complete` once (Avg division) when they finish.
class MpiWork : public Work::Impl {
 public:
  std::vector<MPI_Request> reqs;
  std::vector<Tensor> keep;          // buffers in flight
  std::vector<int> counts;           // all_to_all count / displacement arrays in flight
  std::function<void()> on_complete;

  ~MpiWork() override {
    if (!complete_) {
      try {
        wait();
      } catch (const std::exception& e) {
        fmt::print(stderr, "error: MPI request failed while destroying its Work: {}\n", e.what());
      }
    }
  }
  bool test() override {
    if (complete_) return true;
    int flag = 0;
    MCPP_MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) finish();
    return complete_;
  }
  void wait() override {
    if (complete_) return;
    MCPP_MPI_CHECK(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
    finish();
  }

 private:
  void finish() {
    complete_ = true;
    if (on_complete) on_complete();
    keep.clear();
  }
  bool complete_ = false;
};

int fit_int(int64_t v, const char* op, const std::string& group, const char* what) {
  if (v > INT_MAX || v < 0) {
    fail("{} on group '{}': {} = {} does not fit MPI's int count (max {}); split the call into smaller pieces", op,
         group, what, v, INT_MAX);
  }
  return static_cast<int>(v);
}

void require_cpu(const Tensor& t, const char* op, const std::string& group) {
  if (!t.is_cpu()) fail("{} on group '{}': the MPI backend needs CPU tensors, got {}", op, group, t.str());
}

// In-place t /= n for float dtypes (the Avg step).
void divide_by(const Tensor& t, int n) {
  const float inv = 1.0f / static_cast<float>(n);
  int64_t numel = t.numel();
  switch (t.dtype()) {
    case DType::F32: {
      float* p = t.data<float>();
      for (int64_t i = 0; i < numel; ++i) p[i] *= inv;
      break;
    }
    case DType::BF16: {
      uint16_t* p = t.data<uint16_t>();
      for (int64_t i = 0; i < numel; ++i) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / static_cast<float>(n));
      break;
    }
    case DType::F16: {
      uint16_t* p = t.data<uint16_t>();
      for (int64_t i = 0; i < numel; ++i) p[i] = f32_to_f16(f16_to_f32(p[i]) / static_cast<float>(n));
      break;
    }
    default: fail("avg: dtype {} is not a float type", dtype_name(t.dtype()));
  }
}

bool overlaps(const Tensor& a, const Tensor& b) {
  auto a0 = reinterpret_cast<uintptr_t>(a.raw()), b0 = reinterpret_cast<uintptr_t>(b.raw());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

MpiCommunicator::MpiCommunicator(std::string name, std::vector<int> global_ranks, int rank,
                                 std::shared_ptr<FlightRecorder> recorder, MPI_Comm comm)
    : Communicator(std::move(name), std::move(global_ranks), rank, std::move(recorder)), comm_(comm) {
  MCPP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  int sz = 0;
  MCPP_MPI_CHECK(MPI_Comm_size(comm_, &sz));
  if (sz != size()) fail("MpiCommunicator '{}': MPI communicator has {} ranks, group lists {}", this->name(), sz, size());
  MCPP_MPI_CHECK(MPI_Comm_dup(comm_, &check_comm_));
  MCPP_MPI_CHECK(MPI_Comm_set_errhandler(check_comm_, MPI_ERRORS_RETURN));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (check_comm_ != MPI_COMM_NULL) MPI_Comm_free(&check_comm_);
  if (comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
}

CommPtr MpiCommunicator::new_group(const std::string& name, const std::vector<int>& global_ranks) {
  auto mine = std::find(global_ranks.begin(), global_ranks.end(), global_rank());
  if (mine == global_ranks.end()) return nullptr;
  std::vector<int> local;  // ranks of this communicator, in the new group's order
  for (int g : global_ranks) {
    auto it = std::find(this->global_ranks().begin(), this->global_ranks().end(), g);
    if (it == this->global_ranks().end()) {
      fail("new_group '{}': global rank {} is not a member of parent group '{}'", name, g, this->name());
    }
    int idx = static_cast<int>(it - this->global_ranks().begin());
    if (std::find(local.begin(), local.end(), idx) != local.end()) fail("new_group '{}': global rank {} listed twice", name, g);
    local.push_back(idx);
  }
  MPI_Group parent_group, group;
  MCPP_MPI_CHECK(MPI_Comm_group(comm_, &parent_group));
  MCPP_MPI_CHECK(MPI_Group_incl(parent_group, static_cast<int>(local.size()), local.data(), &group));
  MPI_Comm newcomm = MPI_COMM_NULL;
  MCPP_MPI_CHECK(MPI_Comm_create_group(comm_, group, /*tag=*/0, &newcomm));
  MCPP_MPI_CHECK(MPI_Group_free(&group));
  MCPP_MPI_CHECK(MPI_Group_free(&parent_group));
  int my_rank = static_cast<int>(mine - global_ranks.begin());
  auto g = std::make_shared<MpiCommunicator>(name, global_ranks, my_rank, recorder_ptr(), newcomm);
  g->set_check_collectives(check_collectives());
  return g;
}

Work MpiCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  require_cpu(t, "all_reduce", name());
  auto w = std::make_unique<MpiWork>();
  w->reqs.resize(1, MPI_REQUEST_NULL);  // null until posted: safe to wait if a check throws first
  w->keep = {t};
  int n = fit_int(t.numel(), "all_reduce", name(), "numel");
  MCPP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.raw(), n, mpi::mpi_datatype(t.dtype()), mpi::mpi_reduce_op(t.dtype(), op),
                                comm_, w->reqs.data()));
  if (op == ReduceOp::Avg) w->on_complete = [t, s = size()] { divide_by(t, s); };
  return Work(std::move(w));
}

Work MpiCommunicator::do_all_gather(Tensor& out, const Tensor& in) {
  require_cpu(in, "all_gather", name());
  require_cpu(out, "all_gather", name());
  auto w = std::make_unique<MpiWork>();
  w->reqs.resize(1, MPI_REQUEST_NULL);  // null until posted: safe to wait if a check throws first
  w->keep = {out, in};
  int n = fit_int(in.numel(), "all_gather", name(), "in.numel");
  fit_int(out.numel(), "all_gather", name(), "out.numel");
  MPI_Datatype dt = mpi::mpi_datatype(in.dtype());
  // In place (Megatron's param all-gather: `in` is this rank's chunk of `out`): MPI_IN_PLACE.
  const void* send = in.raw();
  if (overlaps(in, out)) {
    if (static_cast<char*>(in.raw()) != static_cast<char*>(out.raw()) + static_cast<size_t>(rank()) * in.nbytes()) {
      fail("all_gather on group '{}' (rank {}): in overlaps out but is not out's chunk {}", name(), rank(), rank());
    }
    send = MPI_IN_PLACE;
  }
  MCPP_MPI_CHECK(MPI_Iallgather(send, n, dt, out.raw(), n, dt, comm_, w->reqs.data()));
  return Work(std::move(w));
}

Work MpiCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  require_cpu(in, "reduce_scatter", name());
  require_cpu(out, "reduce_scatter", name());
  auto w = std::make_unique<MpiWork>();
  w->reqs.resize(1, MPI_REQUEST_NULL);  // null until posted: safe to wait if a check throws first
  w->keep = {out, in};
  int n = fit_int(out.numel(), "reduce_scatter", name(), "out.numel");
  fit_int(in.numel(), "reduce_scatter", name(), "in.numel");
  // `out` inside `in` (Megatron's grad reduce-scatter into the bucket's own shard) is not allowed by MPI:
  // reduce into a temporary and copy it over `out` on completion.
  Tensor dst = overlaps(in, out) ? Tensor::empty(out.shape(), out.dtype()) : out;
  w->keep.push_back(dst);
  MCPP_MPI_CHECK(MPI_Ireduce_scatter_block(in.raw(), dst.raw(), n, mpi::mpi_datatype(in.dtype()),
                                           mpi::mpi_reduce_op(in.dtype(), op), comm_, w->reqs.data()));
  bool avg = op == ReduceOp::Avg;
  if (avg || !dst.same_storage(out)) {
    w->on_complete = [out, dst, avg, s = size()]() mutable {
      if (!dst.same_storage(out)) out.copy_from(dst);
      if (avg) divide_by(out, s);
    };
  }
  return Work(std::move(w));
}

Work MpiCommunicator::do_broadcast(Tensor& t, int root) {
  require_cpu(t, "broadcast", name());
  auto w = std::make_unique<MpiWork>();
  w->reqs.resize(1, MPI_REQUEST_NULL);  // null until posted: safe to wait if a check throws first
  w->keep = {t};
  int n = fit_int(t.numel(), "broadcast", name(), "numel");
  MCPP_MPI_CHECK(MPI_Ibcast(t.raw(), n, mpi::mpi_datatype(t.dtype()), root, comm_, w->reqs.data()));
  return Work(std::move(w));
}

Work MpiCommunicator::do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& recv_counts) {
  require_cpu(in, "all_to_all", name());
  require_cpu(out, "all_to_all", name());
  auto w = std::make_unique<MpiWork>();
  w->reqs.resize(1, MPI_REQUEST_NULL);  // null until posted: safe to wait if a check throws first
  w->keep = {out, in};
  size_t p = static_cast<size_t>(size());
  w->counts.resize(4 * p);  // send counts, send displs, recv counts, recv displs
  int* sc = w->counts.data();
  int* sd = sc + p;
  int* rc = sd + p;
  int* rd = rc + p;
  int64_t soff = 0, roff = 0;
  for (size_t i = 0; i < p; ++i) {
    sc[i] = fit_int(send_counts[i], "all_to_all", name(), "a send count");
    rc[i] = fit_int(recv_counts[i], "all_to_all", name(), "a receive count");
    sd[i] = fit_int(soff, "all_to_all", name(), "a send displacement");
    rd[i] = fit_int(roff, "all_to_all", name(), "a receive displacement");
    soff += send_counts[i];
    roff += recv_counts[i];
  }
  MPI_Datatype dt = mpi::mpi_datatype(in.dtype());
  MCPP_MPI_CHECK(MPI_Ialltoallv(in.raw(), sc, sd, dt, out.raw(), rc, rd, dt, comm_, w->reqs.data()));
  return Work(std::move(w));
}

Work MpiCommunicator::do_batch_p2p(const std::vector<P2POp>& ops) {
  auto w = std::make_unique<MpiWork>();
  w->reqs.reserve(ops.size());
  for (const auto& o : ops) {
    require_cpu(o.tensor, "batch_p2p", name());
    int n = fit_int(o.tensor.numel(), "batch_p2p", name(), "numel");
    MPI_Datatype dt = mpi::mpi_datatype(o.tensor.dtype());
    MPI_Request r;
    if (o.kind == P2POp::Kind::Send) {
      MCPP_MPI_CHECK(MPI_Isend(o.tensor.raw(), n, dt, o.peer, kP2PTag + o.tag, comm_, &r));
    } else {
      MCPP_MPI_CHECK(MPI_Irecv(o.tensor.raw(), n, dt, o.peer, kP2PTag + o.tag, comm_, &r));
    }
    w->reqs.push_back(r);
    w->keep.push_back(o.tensor);
  }
  return Work(std::move(w));
}

Work MpiCommunicator::do_barrier() {
  auto w = std::make_unique<MpiWork>();
  w->reqs.resize(1, MPI_REQUEST_NULL);  // null until posted: safe to wait if a check throws first
  MCPP_MPI_CHECK(MPI_Ibarrier(comm_, w->reqs.data()));
  return Work(std::move(w));
}

void MpiCommunicator::exchange_fingerprints(const int64_t* mine, int64_t* all, int n) {
  MCPP_MPI_CHECK(MPI_Allgather(mine, n, MPI_INT64_T, all, n, MPI_INT64_T, check_comm_));
}

}  // namespace mcpp::comm
