// comm_mpi_driver: multi-rank tests of the MPI Communicator, run under mpiexec by ctest
// (tests/comm/tests.cmake) at world sizes 2, 4 and 8. Expected values are computed from rank()/size().
//
//   comm_mpi_driver [gtest flags] --dump-dir=D     gtest suite (a Watchdog turns a hang into a failure)
//   comm_mpi_driver --scenario=watchdog_skip --dump-dir=D
//       the last rank skips one world all_reduce and sleeps; the watchdog must dump every rank and
//       MPI_Abort the job (checked by tests/comm/watchdog_check.py)
//
// Named *_driver.cpp (not *_test.cpp) so the single-process mcpp_tests glob does not pick it up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "mcpp/comm/mpi/mpi_communicator.h"
#include "mcpp/comm/watchdog.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

std::string g_dump_dir = "/tmp";

// ---- helpers ----------------------------------------------------------------------------------------

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
  return t;
}

std::vector<double> values(const Tensor& t) {
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

// Exact for every dtype here: small integers and halves are representable in bf16/fp16.
void expect_values(const Tensor& t, const std::vector<double>& want, const std::string& what) {
  auto got = values(t);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << what << " element " << i;
}

const DType kAllDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
bool is_float(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

// ---- collectives --------------------------------------------------------------------------------------

TEST(CommMpi, AllReduceEveryOpAndDtype) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  const int c = 5;
  for (DType dt : kAllDtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
      if (op == ReduceOp::Avg && !is_float(dt)) continue;
      std::vector<double> mine(c), want(c);
      for (int i = 0; i < c; ++i) {
        mine[static_cast<size_t>(i)] = (r + 1) + i;  // rank-dependent
        double sum = n * (n + 1) / 2.0 + static_cast<double>(n) * i;
        want[static_cast<size_t>(i)] = op == ReduceOp::Sum ? sum : op == ReduceOp::Max ? n + i : op == ReduceOp::Min ? 1 + i : sum / n;
      }
      Tensor t = make(dt, mine);
      w->all_reduce(t, op).wait();
      expect_values(t, want, fmt::format("all_reduce {} {}", reduce_op_name(op), dtype_name(dt)));
    }
  }
}

TEST(CommMpi, AllReduceFp32VsFloat64Reference) {
  auto w = world();
  const int n = w->size();
  const int c = 1000;
  auto val = [](int rank, int i) { return std::sin(0.37 * i + 1.3 * rank) * (1 + rank); };  // any rank's data
  Tensor t = Tensor::empty({c});
  for (int i = 0; i < c; ++i) t.data<float>()[i] = static_cast<float>(val(w->rank(), i));
  w->all_reduce(t, ReduceOp::Sum).wait();
  for (int i = 0; i < c; ++i) {
    double ref = 0;
    for (int q = 0; q < n; ++q) ref += static_cast<float>(val(q, i));
    // fp32 sum of n <= 8 terms of magnitude <= 8: rounding error <= n * 2^-24 * 64
    EXPECT_NEAR(t.data<float>()[i], ref, 1e-4) << "element " << i;
  }
}

TEST(CommMpi, AllGatherEveryDtype) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  for (DType dt : kAllDtypes) {
    Tensor in = make(dt, {r * 10.0, r * 10.0 + 1, r * 10.0 + 2});
    Tensor out = Tensor::empty({n, 3}, dt);
    w->all_gather(out, in).wait();
    std::vector<double> want;
    for (int q = 0; q < n; ++q)
      for (int j = 0; j < 3; ++j) want.push_back(q * 10.0 + j);
    expect_values(out.view({-1}), want, fmt::format("all_gather {}", dtype_name(dt)));
  }
}

TEST(CommMpi, ReduceScatterEveryOpAndDtype) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  const int c = 3;
  for (DType dt : kAllDtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg}) {
      if (op == ReduceOp::Avg && !is_float(dt)) continue;
      std::vector<double> mine(static_cast<size_t>(n * c));
      for (int k = 0; k < n * c; ++k) mine[static_cast<size_t>(k)] = r + (k % 7);  // rank r contributes r + k%7
      Tensor in = make(dt, mine), out = Tensor::empty({c}, dt);
      w->reduce_scatter(out, in, op).wait();
      std::vector<double> want(c);
      for (int j = 0; j < c; ++j) {
        double base = (r * c + j) % 7;
        double sum = n * base + n * (n - 1) / 2.0;
        want[static_cast<size_t>(j)] =
            op == ReduceOp::Sum ? sum : op == ReduceOp::Max ? base + n - 1 : op == ReduceOp::Min ? base : sum / n;
      }
      expect_values(out, want, fmt::format("reduce_scatter {} {}", reduce_op_name(op), dtype_name(dt)));
    }
  }
}

TEST(CommMpi, InPlaceAllGatherAndReduceScatterOnOneBuffer) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  const int c = 4;
  // Megatron's distributed optimizer: grads reduce-scattered into this rank's shard of the bucket, then
  // params all-gathered from the shard back into the bucket - both on the same buffer.
  std::vector<double> mine(static_cast<size_t>(n * c));
  for (int k = 0; k < n * c; ++k) mine[static_cast<size_t>(k)] = k + r;
  Tensor bucket = make(DType::F32, mine);
  Tensor shard = bucket.flat_slice(static_cast<int64_t>(r) * c, {c});
  w->reduce_scatter(shard, bucket, ReduceOp::Avg).wait();
  std::vector<double> want_shard(c);
  for (int j = 0; j < c; ++j) want_shard[static_cast<size_t>(j)] = (r * c + j) + (n - 1) / 2.0;
  expect_values(shard, want_shard, "in-place reduce_scatter avg");
  w->all_gather(bucket, shard).wait();
  std::vector<double> want(static_cast<size_t>(n * c));
  for (int k = 0; k < n * c; ++k) want[static_cast<size_t>(k)] = k + (n - 1) / 2.0;
  expect_values(bucket, want, "in-place all_gather");
}

TEST(CommMpi, BroadcastFromEveryRoot) {
  auto w = world();
  for (int root = 0; root < w->size(); ++root) {
    Tensor t = make(DType::I64, {w->rank() == root ? root * 100.0 + 7 : -1.0, w->rank() == root ? 3.0 : -1.0});
    w->broadcast(t, root).wait();
    expect_values(t, {root * 100.0 + 7, 3.0}, fmt::format("broadcast root {}", root));
  }
}

TEST(CommMpi, AllToAllVariableSplits) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  auto cnt = [](int from, int to) { return static_cast<int64_t>((from + 2 * to) % 3); };  // 0..2, zeros included
  std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
  std::vector<double> send, want;
  for (int p = 0; p < n; ++p) {
    sc[static_cast<size_t>(p)] = cnt(r, p);
    rc[static_cast<size_t>(p)] = cnt(p, r);
    for (int k = 0; k < cnt(r, p); ++k) send.push_back(r * 1000 + p * 10 + k);
    for (int k = 0; k < cnt(p, r); ++k) want.push_back(p * 1000 + r * 10 + k);
  }
  Tensor in = make(DType::F32, send), out = Tensor::empty({static_cast<int64_t>(want.size())});
  w->all_to_all(out, in, sc, rc).wait();
  expect_values(out, want, "all_to_all");
}

TEST(CommMpi, BatchedSendRecvRing) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // two messages each way in one batch, different sizes and dtypes
  Tensor s1 = make(DType::F32, {r + 0.5, r + 1.5}), s2 = make(DType::I64, {r * 3.0, r * 3.0 + 1, r * 3.0 + 2});
  Tensor r1 = Tensor::empty({2}), r2 = Tensor::empty({3}, DType::I64);
  Tensor b1 = make(DType::I32, {r * 7.0}), rb1 = Tensor::empty({1}, DType::I32);
  std::vector<P2POp> ops = {{P2POp::Kind::Send, s1, next}, {P2POp::Kind::Recv, r1, prev},
                            {P2POp::Kind::Send, s2, next}, {P2POp::Kind::Recv, r2, prev},
                            {P2POp::Kind::Send, b1, prev}, {P2POp::Kind::Recv, rb1, next}};
  w->batch_p2p(ops).wait();
  expect_values(r1, {prev + 0.5, prev + 1.5}, "ring fp32 from prev");
  expect_values(r2, {prev * 3.0, prev * 3.0 + 1, prev * 3.0 + 2}, "ring int64 from prev");
  expect_values(rb1, {next * 7.0}, "reverse ring int32 from next");
}

TEST(CommMpi, AsyncWorkOverlapTestAndWait) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  Tensor a = make(DType::F32, std::vector<double>(4096, r + 1.0));
  Tensor gin = make(DType::I32, {static_cast<double>(r)}), gout = Tensor::empty({n}, DType::I32);
  Work wa = w->all_reduce(a, ReduceOp::Sum);  // two collectives in flight at once
  Work wg = w->all_gather(gout, gin);
  int polls = 0;
  while (!wg.test()) ++polls;  // test() makes progress on its own
  EXPECT_TRUE(wg.test()) << "test() stays true once complete";
  wa.wait();
  wa.wait();  // waiting twice is fine
  EXPECT_TRUE(wa.test());
  std::vector<double> want_g;
  for (int q = 0; q < n; ++q) want_g.push_back(q);
  expect_values(gout, want_g, "all_gather in flight with all_reduce");
  expect_values(a, std::vector<double>(4096, n * (n + 1) / 2.0), "all_reduce in flight with all_gather");
  // the barrier completes only when everyone arrives; afterwards test() is true
  Work b = w->barrier();
  b.wait();
  EXPECT_TRUE(b.test());
}

TEST(CommMpi, SubGroupsFromNewGroup) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  std::vector<int> even, odd, reversed;
  for (int q = 0; q < n; ++q) (q % 2 ? odd : even).push_back(q);
  for (int q = n - 1; q >= 0; --q) reversed.push_back(q);
  // Every rank walks every group in the same order (Megatron style); non-members get nullptr.
  CommPtr ge = w->new_group("even", even), go = w->new_group("odd", odd), gr = w->new_group("reversed", reversed);
  CommPtr mine = r % 2 ? go : ge;
  ASSERT_TRUE(mine);
  EXPECT_EQ((r % 2 ? ge : go), nullptr) << "non-member gets nullptr";
  const auto& members = r % 2 ? odd : even;
  EXPECT_EQ(mine->size(), static_cast<int>(members.size()));
  EXPECT_EQ(mine->global_rank(), r);
  EXPECT_EQ(mine->rank(), r / 2);
  Tensor t = make(DType::I64, {static_cast<double>(r)});
  mine->all_reduce(t, ReduceOp::Sum).wait();
  double want = 0;
  for (int q : members) want += q;
  expect_values(t, {want}, "sum of global ranks over the parity group");
  // group order = list order: in "reversed", group rank 0 is global rank n-1
  ASSERT_TRUE(gr);
  EXPECT_EQ(gr->rank(), n - 1 - r);
  Tensor b = make(DType::F32, {static_cast<double>(r)});
  gr->broadcast(b, 0).wait();
  expect_values(b, {static_cast<double>(n - 1)}, "broadcast from group rank 0 of reversed group");
  // a sub-group of a sub-group: first two members of my parity group (if it has two)
  if (members.size() >= 2) {
    std::vector<int> pair(members.begin(), members.begin() + 2);
    CommPtr gp = mine->new_group("pair", pair);
    if (gp) {
      Tensor p = make(DType::I32, {1.0});
      gp->all_reduce(p, ReduceOp::Sum).wait();
      expect_values(p, {2.0}, "pair group sum");
    }
  }
}

TEST(CommMpi, RecorderEntriesPerGroup) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  std::vector<int> all;
  for (int q = 0; q < n; ++q) all.push_back(q);
  CommPtr g = w->new_group("rec", all);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->recorder(), w->recorder()) << "groups share the process recorder";
  Tensor a = Tensor::zeros({6}), gin = Tensor::zeros({2}, DType::I32), gout = Tensor::empty({2 * n}, DType::I32);
  g->all_reduce(a, ReduceOp::Avg).wait();
  g->all_gather(gout, gin).wait();
  Tensor s = Tensor::zeros({3}), rr = Tensor::empty({3});
  g->batch_p2p({{P2POp::Kind::Send, s, (r + 1) % n}, {P2POp::Kind::Recv, rr, (r + n - 1) % n}}).wait();
  g->barrier().wait();
  std::vector<RecordEntry> mine;
  for (auto& e : w->recorder()->entries())
    if (e.group == "rec") mine.push_back(e);
  ASSERT_EQ(mine.size(), 4u);
  EXPECT_EQ(mine[0].op, "all_reduce");
  EXPECT_EQ(mine[0].reduce_op, "avg");
  EXPECT_EQ(mine[0].dtype, "float32");
  EXPECT_EQ(mine[0].count, 6);
  EXPECT_EQ(mine[0].seq, 1u);
  EXPECT_EQ(mine[1].op, "all_gather");
  EXPECT_EQ(mine[1].dtype, "int32");
  EXPECT_EQ(mine[1].count, 2);
  EXPECT_EQ(mine[1].seq, 2u);
  EXPECT_EQ(mine[2].op, "batch_p2p");
  EXPECT_EQ(mine[2].seq, 0u);
  EXPECT_EQ(mine[2].p2p_seq, 1u);
  EXPECT_EQ(mine[2].count, 3);
  EXPECT_EQ(mine[2].peers, (std::vector<int>{(r + 1) % n, (r + n - 1) % n}));
  EXPECT_EQ(mine[3].op, "barrier");
  EXPECT_EQ(mine[3].seq, 3u) << "p2p batches do not advance the collective seq";
  for (const auto& e : mine) {
    EXPECT_EQ(e.state, EntryState::Done) << e.op;
    EXPECT_EQ(e.group_ranks, all);
    EXPECT_GE(e.end_steady_ns, e.start_steady_ns);
    EXPECT_GT(e.end_wall_us, 0);
  }
  EXPECT_TRUE(w->recorder()->pending().empty());
}

TEST(CommMpi, CheckCollectivesCatchesDifferentOps) {
  auto w = world();
  const int n = w->size(), r = w->rank();
  std::vector<int> all;
  for (int q = 0; q < n; ++q) all.push_back(q);
  CommPtr g = w->new_group("chk", all);
  g->set_check_collectives(true);
  Tensor t = Tensor::zeros({4});
  g->all_reduce(t, ReduceOp::Sum).wait();  // matching calls pass the check
  // rank 0 issues all_reduce(4 floats), the others all_gather(4 floats): every rank must throw
  std::string msg;
  try {
    if (r == 0) {
      g->all_reduce(t, ReduceOp::Sum).wait();
    } else {
      Tensor out = Tensor::empty({4 * n});
      g->all_gather(out, t).wait();
    }
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("--check-collectives"), std::string::npos) << msg;
  EXPECT_NE(msg.find("group rank 0 (global 0) issued all_reduce(sum) float32 count 4 seq 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("group rank 1 (global 1) issued all_gather float32 count 4 seq 2"), std::string::npos) << msg;
  auto entries = w->recorder()->entries();
  EXPECT_EQ(entries.back().state, EntryState::Failed) << "the refused call is marked failed, not pending";
  // a count mismatch of the same op is caught too
  msg.clear();
  try {
    Tensor u = Tensor::zeros({r == n - 1 ? 5 : 4});
    g->all_reduce(u, ReduceOp::Sum).wait();
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(fmt::format("group rank {} (global {}) issued all_reduce(sum) float32 count 5 seq 3", n - 1, n - 1)),
            std::string::npos)
      << msg;
  // the group stays usable: seqs are still aligned
  Tensor v = Tensor::zeros({2});
  v.fill_(1.0f);
  g->all_reduce(v, ReduceOp::Sum).wait();
  expect_values(v, {static_cast<double>(n), static_cast<double>(n)}, "after the mismatches");
  EXPECT_TRUE(w->recorder()->pending().empty());
}

TEST(CommMpi, ArgumentErrorsAreClear) {
  auto w = world();
  Tensor i32 = Tensor::zeros({2}, DType::I32);
  try {
    (void)w->all_reduce(i32, ReduceOp::Avg);
    ADD_FAILURE() << "avg on int32 must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("avg needs a float dtype, got int32"), std::string::npos) << e.what();
  }
  // 64-bit counts that do not fit MPI's int: a fake 3e9-element view (never touched)
  float dummy = 0;
  const int64_t big = 3'000'000'000;
  Tensor huge = Tensor::from_blob(&dummy, {big}, DType::F32);
  Tensor small = Tensor::zeros({0});
  std::vector<int64_t> sc(static_cast<size_t>(w->size()), 0), rc(static_cast<size_t>(w->size()), 0);
  sc[0] = big;
  try {
    (void)w->all_to_all(small, huge, sc, rc);
    ADD_FAILURE() << "a 3e9 count must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a send count = 3000000000 does not fit MPI's int"), std::string::npos)
        << e.what();
  }
  Tensor out = Tensor::zeros({3});
  try {
    (void)w->all_gather(out, i32);
    ADD_FAILURE() << "dtype mismatch must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out dtype float32 != in dtype int32"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(w->recorder()->pending().empty()) << "refused calls are not left pending";
  w->barrier().wait();
}

// ---- watchdog scenario ----------------------------------------------------------------------------------

int run_watchdog_skip() {
  auto w = world();
  WatchdogOptions o{.timeout_seconds = distributed_timeout_seconds(10.0),
                    .dump_dir = g_dump_dir,
                    .grace_seconds = 5.0,
                    .on_abort = mpi_abort_action()};
  Watchdog dog(w, o);  // world seq 1 (run-id broadcast)
  const int skipper = w->size() - 1;
  for (int step = 0; step < 3; ++step) {  // world seqs 2, 3, 4 complete; seq 5 is the stuck one
    Tensor t = Tensor::zeros({8});
    if (step == 2 && w->rank() == skipper) {
      std::this_thread::sleep_for(std::chrono::seconds(300));  // "stuck" outside any collective
    }
    w->all_reduce(t, ReduceOp::Sum).wait();
    if (step == 1) {
      Tensor x = Tensor::zeros({2});
      w->all_reduce(x, ReduceOp::Max).wait();
    }
  }
  fmt::print(stderr, "rank {}: watchdog scenario finished without an abort (unexpected)\n", w->rank());
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
    if (a.rfind("--dump-dir=", 0) == 0) g_dump_dir = a.substr(11);
    if (a.rfind("--scenario=", 0) == 0) scenario = a.substr(11);
  }
  try {
    auto w = init_mpi(argc, argv);
    if (scenario == "watchdog_skip") {
      int rc = run_watchdog_skip();
      finalize_mpi();
      return rc;
    }
    if (!scenario.empty()) {
      fmt::print(stderr, "error: unknown --scenario={}\n", scenario);
      return 2;
    }
    if (w->rank() != 0) {  // only rank 0 prints progress; every rank's failures still fail mpiexec
      auto& listeners = testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    int rc = 0;
    {
      // A hang becomes a named failure on every rank instead of a ctest timeout.
      Watchdog dog(w, {.timeout_seconds = distributed_timeout_seconds(1.0), .dump_dir = g_dump_dir,
                       .on_abort = mpi_abort_action()});
      rc = RUN_ALL_TESTS();
      w->barrier().wait();
    }
    if (rc != 0) fmt::print(stderr, "rank {}: gtest failures\n", w->rank());
    w.reset();
    finalize_mpi();
    return rc;
  } catch (const mcpp::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
}
