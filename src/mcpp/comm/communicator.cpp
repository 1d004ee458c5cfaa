// Communicator front end: argument checks, flight-recorder bookkeeping (queued -> started -> done /
// failed), the optional --check-collectives fingerprint exchange, then the backend's do_* hook.
// The Work a backend returns is wrapped so that its completion marks the recorder entry done.
#include "mcpp/comm/communicator.h"

#include <atomic>
#include <numeric>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* op_type_name(OpType op) {
  switch (op) {
    case OpType::AllReduce: return "all_reduce";
    case OpType::AllGather: return "all_gather";
    case OpType::ReduceScatter: return "reduce_scatter";
    case OpType::Broadcast: return "broadcast";
    case OpType::AllToAll: return "all_to_all";
    case OpType::BatchP2P: return "batch_p2p";
    case OpType::Barrier: return "barrier";
  }
  return "?";
}

namespace {

std::atomic<bool> g_corrupt_next_result{false};  // arm_result_corruption (--inject-fault corrupt-collective)

// Flips the lowest bit of the result's first byte (a device tensor through a host copy).
void corrupt_result(Tensor& t) {
  if (t.nbytes() == 0) return;
  if (t.is_cpu()) {
    static_cast<unsigned char*>(t.raw())[0] ^= 1u;
    return;
  }
  Tensor h = t.to(Device::CPU);
  static_cast<unsigned char*>(h.raw())[0] ^= 1u;
  t.copy_from(h);
}

// Marks the recorder entry done when the backend's Work completes; waits on destruction if needed. `result`: the
// tensor whose contents must agree across the group once done (all_reduce / all_gather / broadcast; else undefined):
// its checksum goes into the entry (FlightRecorder's payload checksums), and an armed fault injection corrupts it.
class RecordedWork : public Work::Impl {
 public:
  RecordedWork(std::shared_ptr<FlightRecorder> rec, uint64_t id, Work inner, Tensor result, bool checksum)
      : rec_(std::move(rec)), id_(id), inner_(std::move(inner)), result_(std::move(result)), checksum_(checksum) {}
  ~RecordedWork() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: communication failed while destroying an unfinished Work: {}\n", e.what());
    }
  }
  bool test() override {
    if (!done_ && inner_.test()) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    inner_.wait();
    finish();
  }

 private:
  void finish() {
    done_ = true;
    if (result_.defined() && g_corrupt_next_result.load(std::memory_order_relaxed) &&  // (a load when not armed)
        g_corrupt_next_result.exchange(false))
      corrupt_result(result_);
    if (result_.defined() && checksum_) rec_->set_result_checksum(id_, tensor_checksum(result_));
    rec_->mark_done(id_);
  }
  std::shared_ptr<FlightRecorder> rec_;
  uint64_t id_;
  Work inner_;
  Tensor result_;
  bool checksum_;
  bool done_ = false;
};

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

constexpr int kFingerprintLen = 6;  // op, dtype, count, seq, reduce op, root

}  // namespace

struct Communicator::CallInfo {
  OpType op;
  int reduce_op = -1;  // ReduceOp as int, -1 when the op does not reduce
  int dtype = -1;      // DType as int, -1 for barrier
  int64_t count = 0;   // compared across ranks unless count_varies
  bool count_varies = false;
  int root = -1;
  std::vector<int> peers = {};  // batch_p2p: global ranks
  std::vector<const Tensor*> payload = {};  // what this rank sends (checksummed before the call)
  Tensor result = {};  // the result every member must hold identically (all_reduce, all_gather, broadcast)
};

void arm_result_corruption() { g_corrupt_next_result = true; }

Communicator::Communicator(std::string name, std::vector<int> global_ranks, int rank,
                           std::shared_ptr<FlightRecorder> recorder)
    : name_(std::move(name)), ranks_(std::move(global_ranks)), rank_(rank), recorder_(std::move(recorder)) {
  if (ranks_.empty()) fail("communicator '{}': empty group", name_);
  if (rank_ < 0 || rank_ >= size()) fail("communicator '{}': rank {} outside group of size {}", name_, rank_, size());
  if (!recorder_) fail("communicator '{}': no flight recorder", name_);
}

void Communicator::check_fingerprint(const CallInfo& info) {
  int64_t mine[kFingerprintLen] = {static_cast<int64_t>(info.op), info.dtype, info.count_varies ? -1 : info.count,
                                   static_cast<int64_t>(seq_), info.reduce_op, info.root};
  std::vector<int64_t> all(static_cast<size_t>(size()) * kFingerprintLen);
  exchange_fingerprints(mine, all.data(), kFingerprintLen);
  auto describe = [&](int r) {
    const int64_t* f = &all[static_cast<size_t>(r) * kFingerprintLen];
    std::string s = fmt::format("group rank {} (global {}) issued {}", r, ranks_[static_cast<size_t>(r)],
                                op_type_name(static_cast<OpType>(f[0])));
    if (f[4] >= 0) s += fmt::format("({})", reduce_op_name(static_cast<ReduceOp>(f[4])));
    if (f[1] >= 0) s += fmt::format(" {}", dtype_name(static_cast<DType>(f[1])));
    if (f[2] >= 0) s += fmt::format(" count {}", f[2]);
    if (f[5] >= 0) s += fmt::format(" root {}", f[5]);
    return s + fmt::format(" seq {}", f[3]);
  };
  std::vector<std::string> diffs;
  for (int r = 1; r < size(); ++r) {
    if (!std::equal(&all[0], &all[kFingerprintLen], &all[static_cast<size_t>(r) * kFingerprintLen])) {
      diffs.push_back(describe(r));
    }
  }
  if (diffs.empty()) return;
  std::string msg = fmt::format("--check-collectives: mismatched collective in group '{}' (seen on global rank {}): {}",
                                name_, global_rank(), describe(0));
  for (const auto& d : diffs) msg += "; but " + d;
  throw Error(msg);
}

Work Communicator::run(const CallInfo& info, const std::function<Work()>& post) {
  bool p2p = info.op == OpType::BatchP2P;
  RecordEntry e;
  e.group = name_;
  e.group_ranks = ranks_;
  e.op = op_type_name(info.op);
  e.reduce_op = info.reduce_op >= 0 ? reduce_op_name(static_cast<ReduceOp>(info.reduce_op)) : "";
  e.dtype = info.dtype >= 0 ? std::string(dtype_name(static_cast<DType>(info.dtype))) : "";
  e.count = info.count;
  e.peers = info.peers;
  const bool checksums = recorder_->checksums();
  if (checksums)
    for (const Tensor* t : info.payload) {
      if (!e.payload_checksum.empty()) e.payload_checksum += '+';
      e.payload_checksum += tensor_checksum(*t);
    }
  if (p2p) {
    e.p2p_seq = ++p2p_seq_;
  } else {
    e.seq = ++seq_;
  }
  uint64_t id = recorder_->record(std::move(e));
  current_entry_ = id;
  try {
    if (check_collectives_ && !p2p) check_fingerprint(info);
    Work w = post();
    recorder_->mark_started(id);
    return Work(std::make_unique<RecordedWork>(recorder_, id, std::move(w), info.result, checksums));
  } catch (...) {
    recorder_->mark_failed(id);
    throw;
  }
}

namespace {
void check_same_dtype(const std::string& group, const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    fail("{} on group '{}': out dtype {} != in dtype {}", op, group, dtype_name(a.dtype()), dtype_name(b.dtype()));
  }
}
void check_avg(const std::string& group, const char* op, ReduceOp r, DType t) {
  if (r == ReduceOp::Avg && !is_float(t)) {
    fail("{} on group '{}': ReduceOp avg needs a float dtype, got {}", op, group, dtype_name(t));
  }
}
void check_defined(const std::string& group, const char* op, const Tensor& t, const char* which) {
  if (!t.defined()) fail("{} on group '{}': {} tensor is undefined", op, group, which);
}
}  // namespace

Work Communicator::all_reduce(Tensor& t, ReduceOp op) {
  check_defined(name_, "all_reduce", t, "the");
  check_avg(name_, "all_reduce", op, t.dtype());
  CallInfo info{.op = OpType::AllReduce, .reduce_op = static_cast<int>(op), .dtype = static_cast<int>(t.dtype()),
                .count = t.numel(), .payload = {&t}, .result = t};
  return run(info, [&] { return do_all_reduce(t, op); });
}

Work Communicator::all_gather(Tensor& out, const Tensor& in) {
  check_defined(name_, "all_gather", in, "in");
  check_defined(name_, "all_gather", out, "out");
  check_same_dtype(name_, "all_gather", out, in);
  if (out.numel() != in.numel() * size()) {
    fail("all_gather on group '{}' (rank {}): out.numel {} != size {} * in.numel {}", name_, rank_, out.numel(),
         size(), in.numel());
  }
  CallInfo info{.op = OpType::AllGather, .dtype = static_cast<int>(in.dtype()), .count = in.numel(), .payload = {&in},
                .result = out};
  return run(info, [&] { return do_all_gather(out, in); });
}

Work Communicator::reduce_scatter(Tensor& out, const Tensor& in, ReduceOp op) {
  check_defined(name_, "reduce_scatter", in, "in");
  check_defined(name_, "reduce_scatter", out, "out");
  check_same_dtype(name_, "reduce_scatter", out, in);
  check_avg(name_, "reduce_scatter", op, in.dtype());
  if (in.numel() != out.numel() * size()) {
    fail("reduce_scatter on group '{}' (rank {}): in.numel {} != size {} * out.numel {}", name_, rank_, in.numel(),
         size(), out.numel());
  }
  CallInfo info{.op = OpType::ReduceScatter, .reduce_op = static_cast<int>(op), .dtype = static_cast<int>(in.dtype()),
                .count = in.numel(), .payload = {&in}};
  return run(info, [&] { return do_reduce_scatter(out, in, op); });
}

Work Communicator::broadcast(Tensor& t, int root) {
  check_defined(name_, "broadcast", t, "the");
  if (root < 0 || root >= size()) fail("broadcast on group '{}': root {} outside group of size {}", name_, root, size());
  CallInfo info{.op = OpType::Broadcast, .dtype = static_cast<int>(t.dtype()), .count = t.numel(), .root = root,
                .payload = {&t}, .result = t};
  return run(info, [&] { return do_broadcast(t, root); });
}

Work Communicator::all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                              const std::vector<int64_t>& recv_counts) {
  check_defined(name_, "all_to_all", in, "in");
  check_defined(name_, "all_to_all", out, "out");
  check_same_dtype(name_, "all_to_all", out, in);
  if (send_counts.size() != static_cast<size_t>(size()) || recv_counts.size() != static_cast<size_t>(size())) {
    fail("all_to_all on group '{}': send_counts ({}) and recv_counts ({}) need one entry per rank ({})", name_,
         send_counts.size(), recv_counts.size(), size());
  }
  for (size_t i = 0; i < send_counts.size(); ++i) {
    if (send_counts[i] < 0 || recv_counts[i] < 0) fail("all_to_all on group '{}': negative count for peer {}", name_, i);
  }
  int64_t ssum = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  int64_t rsum = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
  if (ssum != in.numel()) fail("all_to_all on group '{}' (rank {}): send_counts sum {} != in.numel {}", name_, rank_, ssum, in.numel());
  if (rsum != out.numel()) fail("all_to_all on group '{}' (rank {}): recv_counts sum {} != out.numel {}", name_, rank_, rsum, out.numel());
  CallInfo info{.op = OpType::AllToAll, .dtype = static_cast<int>(in.dtype()), .count = in.numel(), .count_varies = true,
                .payload = {&in}};
  return run(info, [&] { return do_all_to_all(out, in, send_counts, recv_counts); });
}

Work Communicator::batch_p2p(const std::vector<P2POp>& ops) {
  CallInfo info{.op = OpType::BatchP2P};
  for (const auto& o : ops) {
    if (!o.tensor.defined()) fail("batch_p2p on group '{}': undefined tensor", name_);
    if (o.peer < 0 || o.peer >= size()) fail("batch_p2p on group '{}': peer {} outside group of size {}", name_, o.peer, size());
    if (o.tag < 0 || o.tag >= 16) fail("batch_p2p on group '{}': tag {} outside [0, 16)", name_, o.tag);
    if (info.dtype < 0) info.dtype = static_cast<int>(o.tensor.dtype());
    if (o.kind == P2POp::Kind::Send) info.count += o.tensor.numel(), info.payload.push_back(&o.tensor);
    info.peers.push_back(ranks_[static_cast<size_t>(o.peer)]);
  }
  // --check-collectives for P2P: before the real batch, every send tells its peer (same tag) the dtype and count it
  // sends; every receive compares them with what it expects. A peer that is not in a matching batch_p2p leaves this
  // exchange waiting like the real call would (the watchdog names it: the entry is already recorded).
  auto check_p2p = [&] {
    std::vector<P2POp> fp_ops;
    std::vector<Tensor> got;
    for (const auto& o : ops) {
      Tensor f = Tensor::empty({3}, DType::I64);
      if (o.kind == P2POp::Kind::Send) {
        f.data<int64_t>()[0] = static_cast<int64_t>(o.tensor.dtype());
        f.data<int64_t>()[1] = o.tensor.numel();
        f.data<int64_t>()[2] = o.tag;
      } else {
        got.push_back(f);
      }
      fp_ops.push_back({o.kind, f, o.peer, o.tag});
    }
    host().do_batch_p2p(fp_ops).wait();
    size_t k = 0;
    for (const auto& o : ops) {
      if (o.kind != P2POp::Kind::Recv) continue;
      const int64_t* f = got[k++].data<int64_t>();
      if (f[0] == static_cast<int64_t>(o.tensor.dtype()) && f[1] == o.tensor.numel()) continue;
      throw Error(fmt::format(
          "--check-collectives: mismatched batch_p2p in group '{}' (seen on global rank {}, p2p_seq {}): receiving {} "
          "count {} from group rank {} (global {}) with tag {}, but that peer sends {} count {}",
          name_, global_rank(), p2p_seq_, dtype_name(o.tensor.dtype()), o.tensor.numel(), o.peer,
          ranks_[static_cast<size_t>(o.peer)], o.tag, dtype_name(static_cast<DType>(f[0])), f[1]));
    }
  };
  return run(info, [&] {
    if (check_collectives_) check_p2p();
    return do_batch_p2p(ops);
  });
}

Work Communicator::barrier() {
  CallInfo info{.op = OpType::Barrier};
  return run(info, [&] { return do_barrier(); });
}

}  // namespace mcpp::comm
