// nccl_driver: multi-rank tests of the NCCL Communicator on GPUs, run under mpirun (one rank per GPU,
// device = rank % device count). Expected values are computed from rank()/size(), never one world size.
//
//   nccl_driver [gtest flags]                    the op suite (every op, every dtype, groups, ordering)
//   nccl_driver --scenario=watchdog              the last rank skips one all_reduce; rank 0's NCCL watchdog
//                                                must abort the stuck collective (timeout 3 s) and every later
//                                                call must throw; prints "WATCHDOG OK" on rank 0
//   nccl_driver --scenario=bandwidth             rank 0 prints a markdown table of all_reduce / all_gather /
//                                                reduce_scatter times, algorithm and bus bandwidth (nccl-tests'
//                                                definitions) for bf16 messages of 1 MiB .. 1 GiB
// Without a CUDA device (or fewer devices than ranks) it prints "SKIPPED: ..." and exits 0 (ctest marks
// the test skipped through SKIP_REGULAR_EXPRESSION).
// Named *_driver.cpp (not *_test.cpp) so the single-process mcpp_tests glob does not pick it up.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/comm/mpi/mpi_communicator.h"
#include "mcpp/comm/nccl/nccl_communicator.h"
#include "mcpp/core/device_clock.h"
#include "mcpp/core/device_memory.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

CommPtr g_nccl;

Tensor make(DType dt, const std::vector<double>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, dt);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dt) {
      case DType::F32: t.data<float>()[i] = static_cast<float>(v[i]); break;
      case DType::BF16: t.data<uint16_t>()[i] = f32_to_bf16(static_cast<float>(v[i])); break;
      case DType::F16: t.data<uint16_t>()[i] = f32_to_f16(static_cast<float>(v[i])); break;
      case DType::I32: t.data<int32_t>()[i] = static_cast<int32_t>(v[i]); break;
      case DType::I64: t.data<int64_t>()[i] = static_cast<int64_t>(v[i]); break;
    }
  }
  return t.to(Device::CUDA);
}

std::vector<double> values(const Tensor& dev) {
  Tensor t = dev.to(Device::CPU);  // syncs the compute stream
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype()) {
      case DType::F32: out[i] = t.data<float>()[i]; break;
      case DType::BF16: out[i] = bf16_to_f32(t.data<uint16_t>()[i]); break;
      case DType::F16: out[i] = f16_to_f32(t.data<uint16_t>()[i]); break;
      case DType::I32: out[i] = t.data<int32_t>()[i]; break;
      case DType::I64: out[i] = static_cast<double>(t.data<int64_t>()[i]); break;
    }
  }
  return out;
}

// Exact for every dtype here: small integers and halves are representable in bf16 / fp16.
void expect_values(const Tensor& t, const std::vector<double>& want, const std::string& what) {
  auto got = values(t);
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < want.size() && bad < 5; ++i) {
    if (got[i] != want[i]) {
      ++bad;
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << " want " << want[i];
    }
  }
}

const DType kAllDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
bool is_float(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

TEST(CommNccl, AllReduceEveryOpAndDtype) {
  auto& w = g_nccl;
  const int n = w->size(), r = w->rank(), c = 5;
  for (DType dt : kAllDtypes) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::Avg && !is_float(dt)) continue;
      std::vector<double> mine(c), want(c);
      for (int i = 0; i < c; ++i) {
        mine[static_cast<size_t>(i)] = (r + 1) + i;
        double sum = n * (n + 1) / 2.0 + static_cast<double>(n) * i;
        want[static_cast<size_t>(i)] = op == ReduceOp::Sum   ? sum
                                       : op == ReduceOp::Max ? n + i
                                       : op == ReduceOp::Min ? 1 + i
                                                             : sum / n;
      }
      Tensor t = make(dt, mine);
      w->all_reduce(t, op).wait();
      expect_values(t, want, fmt::format("all_reduce {} {}", reduce_op_name(op), dtype_name(dt)));
    }
  }
}

TEST(CommNccl, AllReduceLargeFp32VsFloat64Reference) {
  auto& w = g_nccl;
  const int n = w->size();
  const int c = 1 << 22;  // 16 MiB: NCCL's multi-chunk, multi-channel path
  auto val = [](int rank, int i) { return std::sin(0.37 * (i % 100003) + 1.3 * rank) * (1 + rank); };
  Tensor h = Tensor::empty({c});
  for (int i = 0; i < c; ++i) h.data<float>()[i] = static_cast<float>(val(w->rank(), i));
  Tensor t = h.to(Device::CUDA);
  w->all_reduce(t, ReduceOp::Sum).wait();
  Tensor got = t.to(Device::CPU);
  double max_err = 0;
  for (int i = 0; i < c; ++i) {
    double ref = 0;
    for (int q = 0; q < n; ++q) ref += static_cast<float>(val(q, i));
    max_err = std::max(max_err, std::abs(got.data<float>()[i] - ref));
  }
  // fp32 sum of n <= 8 terms of magnitude <= 8: rounding error <= n * 2^-24 * 64
  EXPECT_LT(max_err, 1e-4);
}

TEST(CommNccl, AllGatherEveryDtypeAndInPlace) {
  auto& w = g_nccl;
  const int n = w->size(), r = w->rank();
  std::vector<double> want;
  for (int q = 0; q < n; ++q)
    for (int j = 0; j < 3; ++j) want.push_back(q * 10.0 + j);
  for (DType dt : kAllDtypes) {
    Tensor in = make(dt, {r * 10.0, r * 10.0 + 1, r * 10.0 + 2});
    Tensor out = Tensor::zeros({n, 3}, dt, Device::CUDA);
    w->all_gather(out, in).wait();
    expect_values(out.view({-1}), want, fmt::format("all_gather {}", dtype_name(dt)));
    // In place: `in` is out's chunk `rank` (Megatron's param gather).
    std::vector<double> mine(static_cast<size_t>(3 * n), -1.0);
    for (int j = 0; j < 3; ++j) mine[static_cast<size_t>(r * 3 + j)] = r * 10.0 + j;
    Tensor buf = make(dt, mine);
    Tensor chunk = buf.flat_slice(3 * r, {3});
    w->all_gather(buf, chunk).wait();
    expect_values(buf, want, fmt::format("all_gather in place {}", dtype_name(dt)));
  }
}

TEST(CommNccl, ReduceScatterEveryOpAndDtypeAndInPlace) {
  auto& w = g_nccl;
  const int n = w->size(), r = w->rank(), c = 3;
  for (DType dt : kAllDtypes) {
    for (ReduceOp op : kOps) {
      if (op == ReduceOp::Avg && !is_float(dt)) continue;
      std::vector<double> mine(static_cast<size_t>(n * c));
      for (int k = 0; k < n * c; ++k) mine[static_cast<size_t>(k)] = r + (k % 7);
      std::vector<double> want(c);
      for (int j = 0; j < c; ++j) {
        double base = (r * c + j) % 7;
        double sum = n * base + n * (n - 1) / 2.0;
        want[static_cast<size_t>(j)] =
            op == ReduceOp::Sum ? sum : op == ReduceOp::Max ? base + n - 1 : op == ReduceOp::Min ? base : sum / n;
      }
      std::string what = fmt::format("reduce_scatter {} {}", reduce_op_name(op), dtype_name(dt));
      Tensor in = make(dt, mine), out = Tensor::zeros({c}, dt, Device::CUDA);
      w->reduce_scatter(out, in, op).wait();
      expect_values(out, want, what);
      Tensor in2 = make(dt, mine);  // in place: out is in's chunk `rank` (the bucket's own shard)
      Tensor shard = in2.flat_slice(static_cast<int64_t>(c) * r, {c});
      w->reduce_scatter(shard, in2, op).wait();
      expect_values(shard, want, what + " in place");
      if (n > 1) {  // out overlapping in elsewhere (chunk rank+1): through the temporary
        Tensor in3 = make(dt, mine);
        int other = (r + 1) % n;
        Tensor wrong = in3.flat_slice(static_cast<int64_t>(c) * other, {c});
        w->reduce_scatter(wrong, in3, op).wait();
        expect_values(wrong, want, what + " overlapping");
      }
    }
  }
}

TEST(CommNccl, BroadcastFromEveryRoot) {
  auto& w = g_nccl;
  const int n = w->size(), r = w->rank();
  for (DType dt : {DType::F32, DType::BF16, DType::I64}) {
    for (int root = 0; root < n; ++root) {
      Tensor t = make(dt, {r * 100.0 + 1, r * 100.0 + 2, 7});
      w->broadcast(t, root).wait();
      expect_values(t, {root * 100.0 + 1, root * 100.0 + 2, 7}, fmt::format("broadcast root {} {}", root, dtype_name(dt)));
    }
  }
}

TEST(CommNccl, AllToAllVariableCounts) {
  auto& w = g_nccl;
  const int n = w->size(), r = w->rank();
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    // rank r sends (r + p) % 3 elements to peer p (some zero), value 100 * r + 10 * p + j
    std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
    std::vector<double> mine, want;
    for (int p = 0; p < n; ++p) {
      sc[static_cast<size_t>(p)] = (r + p) % 3;
      rc[static_cast<size_t>(p)] = (p + r) % 3;
      for (int j = 0; j < (r + p) % 3; ++j) mine.push_back(100.0 * r + 10.0 * p + j);
      for (int j = 0; j < (p + r) % 3; ++j) want.push_back(100.0 * p + 10.0 * r + j);
    }
    Tensor in = mine.empty() ? Tensor::zeros({0}, dt, Device::CUDA) : make(dt, mine);
    Tensor out = Tensor::zeros({static_cast<int64_t>(want.size())}, dt, Device::CUDA);
    w->all_to_all(out, in, sc, rc).wait();
    if (!want.empty()) expect_values(out, want, fmt::format("all_to_all {}", dtype_name(dt)));
  }
}

TEST(CommNccl, BatchP2PRingBothDirections) {
  auto& w = g_nccl;
  const int n = w->size(), r = w->rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (DType dt : {DType::F32, DType::BF16, DType::I64}) {
    Tensor to_next = make(dt, {r * 2.0, r * 2.0 + 1}), to_prev = make(dt, {r * 3.0});
    Tensor from_prev = Tensor::zeros({2}, dt, Device::CUDA), from_next = Tensor::zeros({1}, dt, Device::CUDA);
    w->batch_p2p({{P2POp::Kind::Send, to_next, next},
                  {P2POp::Kind::Recv, from_prev, prev},
                  {P2POp::Kind::Send, to_prev, prev},
                  {P2POp::Kind::Recv, from_next, next}})
        .wait();
    expect_values(from_prev, {prev * 2.0, prev * 2.0 + 1}, fmt::format("p2p from prev {}", dtype_name(dt)));
    expect_values(from_next, {next * 3.0}, fmt::format("p2p from next {}", dtype_name(dt)));
  }
}

TEST(CommNccl, StreamOrderingWithoutHostSyncs) {
  // Producer copy on the compute stream -> all_reduce on the comm stream -> consumer copy on the compute
  // stream, no host sync in between: 64 MiB so that a missing event would race visibly.
  auto& w = g_nccl;
  const int n = w->size(), r = w->rank();
  const int64_t c = 1 << 24;
  for (int rep = 0; rep < 3; ++rep) {
    Tensor h = Tensor::empty({c});
    for (int64_t i = 0; i < c; ++i) h.data<float>()[i] = static_cast<float>(r + 1 + rep);
    Tensor src = h.to(Device::CUDA);
    Tensor t = Tensor::zeros({c}, DType::F32, Device::CUDA);
    t.copy_from(src);  // async d2d on the compute stream
    Work work = w->all_reduce(t, ReduceOp::Sum);
    work.wait();  // orders the compute stream only
    Tensor u = Tensor::zeros({c}, DType::F32, Device::CUDA);
    u.copy_from(t);
    Tensor back = u.to(Device::CPU);
    const float want = static_cast<float>(n * (n + 1) / 2 + n * rep);
    int64_t bad = 0;
    for (int64_t i = 0; i < c; ++i) bad += back.data<float>()[i] != want;
    EXPECT_EQ(bad, 0) << "rep " << rep;
  }
}

TEST(CommNccl, TestPollsToCompletionAndBarrier) {
  auto& w = g_nccl;
  Tensor t = make(DType::F32, {1, 2, 3});
  Work work = w->all_reduce(t, ReduceOp::Max);
  auto t0 = std::chrono::steady_clock::now();
  while (!work.test()) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30)) << "test() never became true";
  }
  expect_values(t, {1, 2, 3}, "all_reduce max of equal values");
  w->barrier().wait();
}

TEST(CommNccl, NewGroupsInCanonicalOrder) {
  auto& w = g_nccl;
  const int n = w->size(), r = w->rank();
  // Every rank loops over all groups in the same order: even/odd ranks, then all ranks reversed.
  std::vector<std::vector<int>> parity(2);
  for (int q = 0; q < n; ++q) parity[static_cast<size_t>(q % 2)].push_back(q);
  CommPtr mine;
  for (int k = 0; k < 2; ++k) {
    if (parity[static_cast<size_t>(k)].empty()) continue;
    auto g = w->new_group(fmt::format("parity{}", k), parity[static_cast<size_t>(k)]);
    if (k == r % 2) {
      ASSERT_TRUE(g) << "member got no group";
      mine = g;
    } else {
      EXPECT_FALSE(g) << "non-member got a group";
    }
  }
  Tensor t = make(DType::F32, {static_cast<double>(r)});
  mine->all_reduce(t, ReduceOp::Sum).wait();
  double want = 0;
  for (int q : parity[static_cast<size_t>(r % 2)]) want += q;
  expect_values(t, {want}, "parity group all_reduce");

  std::vector<int> rev;
  for (int q = n - 1; q >= 0; --q) rev.push_back(q);
  auto g = w->new_group("reversed", rev);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->rank(), n - 1 - r);
  Tensor in = make(DType::I32, {static_cast<double>(r)});
  Tensor out = Tensor::zeros({n}, DType::I32, Device::CUDA);
  g->all_gather(out, in).wait();
  std::vector<double> want_rev(rev.begin(), rev.end());
  expect_values(out, want_rev, "reversed group all_gather in group order");
  g->set_check_collectives(true);  // fingerprint exchange over NCCL
  Tensor x = make(DType::BF16, {1.5});
  g->all_reduce(x, ReduceOp::Avg).wait();
  expect_values(x, {1.5}, "check_collectives all_reduce avg");
}

TEST(CommNccl, CpuTensorIsANamedError) {
  Tensor t = Tensor::zeros({4});
  try {
    (void)g_nccl->all_reduce(t, ReduceOp::Sum);
    FAIL() << "no error";
  } catch (const mcpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs CUDA tensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nccl_world"), std::string::npos) << e.what();
  }
}

TEST(CommNccl, FlightRecorderSeesEveryCall) {
  auto& w = g_nccl;
  uint64_t before = w->recorder()->total_recorded();
  Tensor t = make(DType::F32, {1});
  w->all_reduce(t, ReduceOp::Sum).wait();
  w->barrier().wait();
  EXPECT_EQ(w->recorder()->total_recorded(), before + 2);
  auto e = w->recorder()->entries();
  ASSERT_GE(e.size(), 2u);
  EXPECT_EQ(e[e.size() - 2].op, "all_reduce");
  EXPECT_EQ(e.back().op, "barrier");
  EXPECT_EQ(e.back().group, "nccl_world");
  EXPECT_EQ(e.back().state, EntryState::Done);
  EXPECT_EQ(w->recorder()->pending().size(), 0u);
}

// Device timing (FlightRecorder::set_device_clock, the timeline's collectives row): with a DeviceClock
// attached each NCCL op stores two marks on the comm stream — never before a compute-stream mark made just
// ahead of it (the comm stream waits for the compute stream), spanning the transfer (a 256 MiB all-reduce
// takes well over 10 us), ops in comm-stream order; batch_p2p too; detached again: no marks.
TEST(CommNccl, DeviceClockMarksEachOpOnTheCommStream) {
  auto& w = g_nccl;
  DeviceClock clock;
  Tensor big = Tensor::zeros({64 << 20}, DType::F32, Device::CUDA);  // 256 MiB
  w->all_reduce(big, ReduceOp::Sum).wait();   // warm: buffers registered, channels up
  w->recorder()->set_device_clock(&clock);
  const int64_t before = clock.mark();
  w->all_reduce(big, ReduceOp::Sum).wait();
  const int next = (w->rank() + 1) % w->size(), prev = (w->rank() + w->size() - 1) % w->size();
  Tensor send = Tensor::zeros({1024}, DType::F32, Device::CUDA), recv = Tensor::zeros({1024}, DType::F32, Device::CUDA);
  w->batch_p2p({{P2POp::Kind::Send, send, next}, {P2POp::Kind::Recv, recv, prev}}).wait();
  w->recorder()->set_device_clock(nullptr);
  w->all_reduce(big, ReduceOp::Sum).wait();
  const auto e = w->recorder()->entries();
  ASSERT_GE(e.size(), 3u);
  const RecordEntry &ar = e[e.size() - 3], &p2p = e[e.size() - 2], &untimed = e.back();
  EXPECT_EQ(ar.op, "all_reduce");
  EXPECT_EQ(p2p.op, "batch_p2p");
  ASSERT_GE(ar.device_start, 0);
  ASSERT_GT(ar.device_end, ar.device_start);
  ASSERT_GE(p2p.device_start, 0);
  EXPECT_EQ(untimed.device_start, -1);
  EXPECT_EQ(untimed.device_end, -1);
  const double ar_us = clock.micros_between(ar.device_start, ar.device_end);
  EXPECT_GT(ar_us, 10.0);
  EXPECT_GE(clock.micros_between(before, ar.device_start), 0.0);
  EXPECT_GE(clock.micros_between(ar.device_end, p2p.device_start), 0.0) << "one comm stream, in order";
  EXPECT_GE(clock.micros_between(p2p.device_start, p2p.device_end), 0.0);
  std::printf("[ measured ] rank %d: 256 MiB all_reduce %.0f us on the comm stream\n", w->rank(), ar_us);
}

// ---- the watchdog scenario --------------------------------------------------------------------------

int run_watchdog(const CommPtr& mpi, int device) {
  std::atomic<int> aborts{0};
  NcclInitOptions opts{.watchdog = {.timeout_seconds = 3.0, .on_abort = [&](int, const std::string&) { ++aborts; }}};
  CommPtr nccl = init_nccl(mpi, device, opts);
  const int last = nccl->size() - 1;
  int rc = 0;
  {  // warm-up on every rank: NCCL connects its channels lazily, on the host, in the first collective
    Tensor w = make(DType::F32, {1});
    nccl->all_reduce(w, ReduceOp::Sum).wait();
    values(w);
  }
  if (nccl->rank() != last) {
    Tensor t = make(DType::F32, {1, 2});
    auto t0 = std::chrono::steady_clock::now();
    Work work = nccl->all_reduce(t, ReduceOp::Sum);  // the last rank never joins
    work.wait();
    try {
      values(t);  // host read: blocks until the watchdog aborts the collective
    } catch (const mcpp::Error&) {
      // a CUDA error surfacing from the aborted kernel is fine too
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int i = 0; i < 100 && aborts.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::string err;
    try {
      (void)nccl->all_reduce(t, ReduceOp::Sum);
    } catch (const mcpp::Error& e) {
      err = e.what();
    }
    bool ok = aborts.load() == 1 && s >= 2.9 && s < 30 && err.find("NCCL watchdog on rank") != std::string::npos &&
              err.find("all_reduce (group 'nccl_world'") != std::string::npos && err.find("seq 2") != std::string::npos;
    fmt::print("rank {}: watchdog fired after {:.2f} s, on_abort calls {}, next call: {}\n", nccl->global_rank(), s,
               aborts.load(), err);
    if (ok && nccl->global_rank() == 0) fmt::print("WATCHDOG OK\n");
    rc = ok ? 0 : 1;
  }
  Tensor flag = Tensor::zeros({1}, DType::I32);
  flag.data<int32_t>()[0] = rc;
  mpi->all_reduce(flag, ReduceOp::Max).wait();  // CPU: every rank learns the result
  rc = flag.data<int32_t>()[0];
  // The skipping rank's communicator never saw its peer's abort: leak both instead of destroying a
  // communicator whose peer is gone (ncclCommDestroy may wait for it).
  new CommPtr(std::move(nccl));
  return rc;
}

// Bus bandwidth of the Communicator's collectives on NCCL, as nccl-tests defines it: size = the all-reduce
// buffer / the all-gather output / the reduce-scatter input, algbw = size / time, busbw = algbw x 2 (n-1)/n
// (all_reduce) or x (n-1)/n (all_gather, reduce_scatter). Time: the slowest rank's wall time of `iters`
// back-to-back calls after 3 warm-up calls, ended by a device synchronization.
int run_bandwidth(const CommPtr& mpi, int device) {
  auto sync_device = [] {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) mcpp::fail("cudaDeviceSynchronize: {}", cudaGetErrorString(e));
  };
  CommPtr nccl = init_nccl(mpi, device, {.watchdog = {.timeout_seconds = 120.0}});
  const int n = nccl->size();
  const bool r0 = nccl->rank() == 0;
  if (r0) {
    fmt::print("NCCL {} on {} ranks (one GPU each), NCCL_NVLS_ENABLE={}\n", nccl_version(), n,
               std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)");
    fmt::print("| op | size | time (us) | algbw (GB/s) | busbw (GB/s) |\n| --- | --- | --- | --- | --- |\n");
  }
  for (const char* op : {"all_reduce", "all_gather", "reduce_scatter"}) {
    for (int64_t bytes = int64_t{1} << 20; bytes <= int64_t{1} << 30; bytes <<= 2) {
      const int64_t elems = bytes / 2 / n * n;  // bf16, divisible by the ranks
      Tensor full = Tensor::zeros({elems}, mcpp::DType::BF16, mcpp::Device::CUDA);
      Tensor part = Tensor::zeros({elems / n}, mcpp::DType::BF16, mcpp::Device::CUDA);
      const std::string name = op;
      auto call = [&] {
        Work w = name == "all_reduce"   ? nccl->all_reduce(full, ReduceOp::Sum)
                 : name == "all_gather" ? nccl->all_gather(full, part)
                                        : nccl->reduce_scatter(part, full, ReduceOp::Sum);
        w.wait();
      };
      const int iters = bytes >= (int64_t{256} << 20) ? 10 : 30;
      for (int i = 0; i < 3; ++i) call();
      sync_device();
      Tensor sync = Tensor::zeros({1}, mcpp::DType::F32);
      mpi->all_reduce(sync, ReduceOp::Sum).wait();  // start together
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) call();
      sync_device();
      Tensor secs = Tensor::zeros({1}, mcpp::DType::F32);
      secs.data<float>()[0] = std::chrono::duration<float>(std::chrono::steady_clock::now() - t0).count() / iters;
      mpi->all_reduce(secs, ReduceOp::Max).wait();
      const double t = secs.data<float>()[0], size = static_cast<double>(elems) * 2;
      const double factor = name == "all_reduce" ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
      if (r0)
        fmt::print("| {} | {} MiB | {:.1f} | {:.1f} | {:.1f} |\n", name, size / (1 << 20), t * 1e6, size / t / 1e9,
                   size / t / 1e9 * factor);
    }
  }
  return 0;
}

}  // namespace
}  // namespace mcpp::comm

int main(int argc, char** argv) {
  using namespace mcpp::comm;
  testing::InitGoogleTest(&argc, argv);
  std::string scenario;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--scenario=", 0) == 0) scenario = a.substr(11);
  }
  try {
    auto mpi = init_mpi(argc, argv);
    int ndev = 0;
    if (mcpp::cuda_available() && cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
    if (ndev < 1) {
      if (mpi->rank() == 0) fmt::print("SKIPPED: no CUDA device visible; the NCCL tests need one GPU per rank\n");
      mpi.reset();
      finalize_mpi();
      return 0;
    }
    int device = mpi->rank() % ndev;
    if (scenario == "watchdog") {
      int rc = run_watchdog(mpi, device);
      mpi.reset();
      finalize_mpi();
      std::_Exit(rc);
    }
    if (scenario == "bandwidth") {
      int rc = run_bandwidth(mpi, device);
      mpi.reset();
      finalize_mpi();
      return rc;
    }
    if (!scenario.empty()) {
      fmt::print(stderr, "error: unknown --scenario={}\n", scenario);
      return 2;
    }
    g_nccl = init_nccl(mpi, device, {.watchdog = {.timeout_seconds = 120.0}});
    if (mpi->rank() == 0) {
      fmt::print("NCCL {} on {} ranks, {} devices visible per process, NCCL_NVLS_ENABLE={}\n", nccl_version(),
                 mpi->size(), ndev, std::getenv("NCCL_NVLS_ENABLE"));
    } else {
      auto& listeners = testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    int rc = RUN_ALL_TESTS();
    mcpp::Tensor flag = mcpp::Tensor::zeros({1}, mcpp::DType::I32);
    flag.data<int32_t>()[0] = rc;
    mpi->all_reduce(flag, ReduceOp::Max).wait();
    rc = flag.data<int32_t>()[0];
    if (rc != 0) fmt::print(stderr, "rank {}: gtest failures somewhere\n", mpi->rank());
    g_nccl.reset();
    mpi.reset();
    finalize_mpi();
    return rc;
  } catch (const mcpp::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
}
