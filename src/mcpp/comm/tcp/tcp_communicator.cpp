// TcpCommunicator: see tcp_communicator.h.
#include "mcpp/comm/tcp/tcp_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/comm/tcp/tcp_mesh.h"
#include "mcpp/comm/tcp/tcp_rendezvous.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

constexpr int kCollectiveTag = 1000;  // P2P tags are 0..15

void require_host(const char* op, const Tensor& t) {
  MCPP_CHECK(!t.defined() || t.is_cpu(),
             "tcp communicator ({}): takes host tensors only, got {} (device tensors go through NCCL)", op, t.str());
}

char* bytes(const Tensor& t) { return static_cast<char*>(t.raw()); }

// Element i of a float/int buffer as double, and back (float dtypes round once).
double load(const char* p, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::BF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h); }
    case DType::F16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return f16_to_f32(h); }
    case DType::I32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::I64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); return static_cast<double>(v); }
  }
  return 0;
}
void store(char* p, DType dt, int64_t i, double x) {
  switch (dt) {
    case DType::F32: { const float v = static_cast<float>(x); std::memcpy(p + 4 * i, &v, 4); return; }
    case DType::BF16: { const uint16_t h = f32_to_bf16(static_cast<float>(x)); std::memcpy(p + 2 * i, &h, 2); return; }
    case DType::F16: { const uint16_t h = f32_to_f16(static_cast<float>(x)); std::memcpy(p + 2 * i, &h, 2); return; }
    case DType::I32: { const auto v = static_cast<int32_t>(x); std::memcpy(p + 4 * i, &v, 4); return; }
    case DType::I64: { const auto v = static_cast<int64_t>(x); std::memcpy(p + 8 * i, &v, 8); return; }
  }
}

// Reduces parts[0..n) (each numel elements of dt) in part order into out. int64 sums exactly.
void reduce_into(char* out, const std::vector<std::vector<char>>& parts, DType dt, int64_t numel, ReduceOp op) {
  const bool is_int = dt == DType::I32 || dt == DType::I64;
  MCPP_CHECK(!(is_int && op == ReduceOp::Avg), "tcp communicator: all_reduce avg needs a float dtype");
  for (int64_t i = 0; i < numel; ++i) {
    if (dt == DType::I64) {
      int64_t acc = 0;
      for (size_t r = 0; r < parts.size(); ++r) {
        int64_t v;
        std::memcpy(&v, parts[r].data() + 8 * i, 8);
        acc = r == 0 ? v : op == ReduceOp::Max ? std::max(acc, v) : op == ReduceOp::Min ? std::min(acc, v) : acc + v;
      }
      std::memcpy(out + 8 * i, &acc, 8);
      continue;
    }
    double acc = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      const double v = load(parts[r].data(), dt, i);
      acc = r == 0 ? v : op == ReduceOp::Max ? std::max(acc, v) : op == ReduceOp::Min ? std::min(acc, v) : acc + v;
    }
    if (op == ReduceOp::Avg) acc /= static_cast<double>(parts.size());
    store(out, dt, i, acc);
  }
}

uint64_t group_hash(const std::string& name, const std::vector<int>& ranks) {
  const std::string key = fmt::format("{}:{}", name, fmt::join(ranks, ","));
  return XXH3_64bits(key.data(), key.size());
}

}  // namespace

TcpCommunicator::TcpCommunicator(std::string name, std::vector<int> global_ranks, int rank,
                                 std::shared_ptr<FlightRecorder> recorder, std::shared_ptr<TcpMesh> mesh)
    : Communicator(name, global_ranks, rank, std::move(recorder)), mesh_(std::move(mesh)),
      group_id_(group_hash(name, global_ranks)) {}

CommPtr TcpCommunicator::new_group(const std::string& name, const std::vector<int>& global_ranks) {
  const auto mine = std::find(global_ranks.begin(), global_ranks.end(), global_rank());
  for (int g : global_ranks)
    MCPP_CHECK(std::find(this->global_ranks().begin(), this->global_ranks().end(), g) != this->global_ranks().end(),
               "new_group '{}': global rank {} is not a member of parent group '{}'", name, g, this->name());
  if (mine == global_ranks.end()) return nullptr;
  auto g = std::make_shared<TcpCommunicator>(name, global_ranks, static_cast<int>(mine - global_ranks.begin()),
                                             recorder_ptr(), mesh_);
  g->set_check_collectives(check_collectives());
  return g;
}

uint64_t TcpCommunicator::channel(int tag) const { return group_id_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(tag); }

std::vector<std::vector<char>> TcpCommunicator::gather_bytes(const void* mine, size_t nbytes) {
  const int n = size();
  std::vector<std::vector<char>> parts(static_cast<size_t>(n));
  parts[static_cast<size_t>(rank())].assign(static_cast<const char*>(mine), static_cast<const char*>(mine) + nbytes);
  std::vector<TcpMesh::Send> sends;
  std::vector<TcpMesh::Recv> recvs;
  for (int r = 0; r < n; ++r) {
    if (r == rank()) continue;
    const int peer = global_ranks()[static_cast<size_t>(r)];
    sends.push_back({peer, channel(kCollectiveTag), mine, nbytes});
    recvs.push_back({peer, channel(kCollectiveTag), &parts[static_cast<size_t>(r)]});
  }
  mesh_->exchange(sends, recvs);
  for (int r = 0; r < n; ++r)
    MCPP_CHECK(parts[static_cast<size_t>(r)].size() == nbytes,
               "tcp communicator (group '{}'): rank {} sent {} bytes, expected {} (mismatched collective)", name(),
               global_ranks()[static_cast<size_t>(r)], parts[static_cast<size_t>(r)].size(), nbytes);
  return parts;
}

Work TcpCommunicator::do_all_reduce(Tensor& t, ReduceOp op) {
  require_host("all_reduce", t);
  if (size() == 1) {  // every op is the identity on one member (the front end checked Avg's dtype)
    MCPP_CHECK(!(op == ReduceOp::Avg && (t.dtype() == DType::I32 || t.dtype() == DType::I64)),
               "tcp communicator: all_reduce avg needs a float dtype");
    return Work();
  }
  const auto parts = gather_bytes(t.raw(), t.nbytes());
  reduce_into(bytes(t), parts, t.dtype(), t.numel(), op);
  return Work();
}

Work TcpCommunicator::do_all_gather(Tensor& out, const Tensor& in) {
  require_host("all_gather", out);
  require_host("all_gather", in);
  const auto parts = gather_bytes(in.raw(), in.nbytes());  // copied before out is written (in may alias out)
  for (size_t r = 0; r < parts.size(); ++r) std::memcpy(bytes(out) + r * in.nbytes(), parts[r].data(), in.nbytes());
  return Work();
}

Work TcpCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  require_host("reduce_scatter", out);
  require_host("reduce_scatter", in);
  Tensor full = in.clone();
  do_all_reduce(full, op);
  std::memcpy(out.raw(), bytes(full) + static_cast<size_t>(rank()) * out.nbytes(), out.nbytes());
  return Work();
}

Work TcpCommunicator::do_broadcast(Tensor& t, int root) {
  require_host("broadcast", t);
  if (size() == 1) return Work();
  const uint64_t ch = channel(kCollectiveTag);
  if (rank() == root) {
    std::vector<TcpMesh::Send> sends;
    for (int r = 0; r < size(); ++r)
      if (r != root) sends.push_back({global_ranks()[static_cast<size_t>(r)], ch, t.raw(), t.nbytes()});
    mesh_->exchange(sends, {});
  } else {
    std::vector<char> m;
    mesh_->exchange({}, {{global_ranks()[static_cast<size_t>(root)], ch, &m}});
    MCPP_CHECK(m.size() == t.nbytes(), "tcp broadcast (group '{}'): got {} bytes, expected {}", name(), m.size(),
               t.nbytes());
    std::memcpy(t.raw(), m.data(), m.size());
  }
  return Work();
}

Work TcpCommunicator::do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                                    const std::vector<int64_t>& recv_counts) {
  require_host("all_to_all", out);
  require_host("all_to_all", in);
  const size_t es = dtype_size(in.dtype());
  std::vector<size_t> soff(send_counts.size() + 1, 0), roff(recv_counts.size() + 1, 0);
  for (size_t r = 0; r < send_counts.size(); ++r) soff[r + 1] = soff[r] + static_cast<size_t>(send_counts[r]) * es;
  for (size_t r = 0; r < recv_counts.size(); ++r) roff[r + 1] = roff[r] + static_cast<size_t>(recv_counts[r]) * es;
  std::vector<std::vector<char>> got(static_cast<size_t>(size()));
  std::vector<TcpMesh::Send> sends;
  std::vector<TcpMesh::Recv> recvs;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    const int peer = global_ranks()[static_cast<size_t>(r)];
    sends.push_back({peer, channel(kCollectiveTag), bytes(in) + soff[static_cast<size_t>(r)],
                     soff[static_cast<size_t>(r) + 1] - soff[static_cast<size_t>(r)]});
    recvs.push_back({peer, channel(kCollectiveTag), &got[static_cast<size_t>(r)]});
  }
  const size_t me = static_cast<size_t>(rank());
  std::vector<char> own(bytes(in) + soff[me], bytes(in) + soff[me + 1]);
  mesh_->exchange(sends, recvs);
  got[me] = std::move(own);
  for (size_t r = 0; r < got.size(); ++r) {
    MCPP_CHECK(got[r].size() == roff[r + 1] - roff[r], "tcp all_to_all (group '{}'): rank {} sent {} bytes, expected {}",
               name(), global_ranks()[r], got[r].size(), roff[r + 1] - roff[r]);
    if (!got[r].empty()) std::memcpy(bytes(out) + roff[r], got[r].data(), got[r].size());
  }
  return Work();
}

Work TcpCommunicator::do_batch_p2p(const std::vector<P2POp>& ops) {
  std::vector<TcpMesh::Send> sends;
  std::vector<TcpMesh::Recv> recvs;
  std::vector<std::vector<char>> got(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& o = ops[i];
    require_host("batch_p2p", o.tensor);
    const int peer = global_ranks()[static_cast<size_t>(o.peer)];
    if (o.kind == P2POp::Kind::Send) sends.push_back({peer, channel(o.tag), o.tensor.raw(), o.tensor.nbytes()});
    else recvs.push_back({peer, channel(o.tag), &got[i]});
  }
  mesh_->exchange(sends, recvs);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != P2POp::Kind::Recv) continue;
    MCPP_CHECK(got[i].size() == ops[i].tensor.nbytes(),
               "tcp batch_p2p (group '{}'): received {} bytes from peer {}, the receive expects {}", name(),
               got[i].size(), ops[i].peer, ops[i].tensor.nbytes());
    std::memcpy(ops[i].tensor.raw(), got[i].data(), got[i].size());
  }
  return Work();
}

Work TcpCommunicator::do_barrier() {
  const char one = 1;
  if (size() > 1) gather_bytes(&one, 1);
  return Work();
}

void TcpCommunicator::exchange_fingerprints(const int64_t* mine, int64_t* all, int n) {
  const auto parts = gather_bytes(mine, sizeof(int64_t) * static_cast<size_t>(n));
  for (size_t r = 0; r < parts.size(); ++r) std::memcpy(all + r * static_cast<size_t>(n), parts[r].data(), parts[r].size());
}

namespace {
// Serves the rank registrations of a tcp:// rendezvous on a thread until every rank has its table (or the owner
// gives up); joined on destruction.
class RendezvousThread {
 public:
  RendezvousThread(const std::string& spec, int world) {
    TcpEndpoint e;
    MCPP_CHECK(parse_tcp_rendezvous(spec, &e), "rendezvous '{}': rank 0 serves only a tcp://HOST:PORT rendezvous", spec);
    server_ = std::make_unique<RendezvousServer>(e.port, world, 1, world);
    thread_ = std::thread([this] {
      while (!stop_ && !server_->ranks_answered()) server_->poll(50);
    });
  }
  ~RendezvousThread() {
    stop_ = true;
    thread_.join();
  }
  RendezvousThread(const RendezvousThread&) = delete;
  RendezvousThread& operator=(const RendezvousThread&) = delete;

 private:
  std::unique_ptr<RendezvousServer> server_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};
}  // namespace

CommPtr init_tcp_world(const TcpInitOptions& opts) {
  std::unique_ptr<RendezvousThread> serving;
  if (opts.serve_rendezvous) serving = std::make_unique<RendezvousThread>(opts.rendezvous_dir, opts.world_size);
  auto mesh = std::make_shared<TcpMesh>(opts.rendezvous_dir, opts.rank, opts.world_size, opts.timeout_seconds);
  serving.reset();
  std::vector<int> ranks(static_cast<size_t>(opts.world_size));
  for (int r = 0; r < opts.world_size; ++r) ranks[static_cast<size_t>(r)] = r;
  auto recorder = std::make_shared<FlightRecorder>(opts.rank, opts.world_size);
  return std::make_shared<TcpCommunicator>("world", ranks, opts.rank, std::move(recorder), std::move(mesh));
}

namespace {
// srun without MPI: Slurm's rank variables and torchrun's master, and none of an MPI launcher's (mpirun inside a
// Slurm allocation keeps its MPI world, as before).
bool under_srun_with_master() {
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"})
    if (!std::getenv(v)) return false;
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return false;
  return true;
}
}  // namespace

bool launched_by_mcpp_launch() { return std::getenv("MCPP_LAUNCH_RDZV") != nullptr || under_srun_with_master(); }

TcpInitOptions tcp_options_from_env() {
  const char* timeout_env = std::getenv("MCPP_LAUNCH_RDZV_TIMEOUT");
  if (!std::getenv("MCPP_LAUNCH_RDZV") && under_srun_with_master()) {  // srun: Slurm's ranks, torchrun's master
    const int rank = std::atoi(std::getenv("SLURM_PROCID")), world = std::atoi(std::getenv("SLURM_NTASKS"));
    MCPP_CHECK(world >= 1 && rank >= 0 && rank < world, "Slurm environment: SLURM_PROCID {} out of range for "
               "SLURM_NTASKS {}", rank, world);
    return {.rendezvous_dir = fmt::format("tcp://{}:{}", std::getenv("MASTER_ADDR"), std::getenv("MASTER_PORT")),
            .rank = rank,
            .world_size = world,
            .timeout_seconds = timeout_env ? std::atof(timeout_env) : 120.0,
            .serve_rendezvous = rank == 0};
  }
  const char* dir = std::getenv("MCPP_LAUNCH_RDZV");
  const char* rank = std::getenv("MCPP_RANK");
  const char* size = std::getenv("MCPP_WORLD_SIZE");
  MCPP_CHECK(dir && rank && size, "mcpp launch environment incomplete: MCPP_LAUNCH_RDZV, MCPP_RANK and "
                                  "MCPP_WORLD_SIZE must all be set");
  const char* timeout = std::getenv("MCPP_LAUNCH_RDZV_TIMEOUT");
  return {.rendezvous_dir = dir,
          .rank = std::atoi(rank),
          .world_size = std::atoi(size),
          .timeout_seconds = timeout ? std::atof(timeout) : 120.0};
}

}  // namespace mcpp::comm
