// LocalCommunicator (size 1): every op is identity / copy, goes through the flight recorder, and argument
// mistakes are caught by the shared front end exactly as on the MPI backend.
#include <cstring>

#include <gtest/gtest.h>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {
namespace {

Tensor iota(int64_t n, float start = 1.0f) {
  Tensor t = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = start + static_cast<float>(i);
  return t;
}

void expect_eq(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.data<float>()[i], b.data<float>()[i]) << i;
}

TEST(LocalCommunicator, EveryOpIsIdentityOrCopy) {
  CommPtr w = make_local_world();
  EXPECT_EQ(w->name(), "world");
  EXPECT_EQ(w->size(), 1);
  EXPECT_EQ(w->rank(), 0);
  EXPECT_EQ(w->global_rank(), 0);
  EXPECT_TRUE(w->takes_device_tensors());  // a single-process CUDA run needs no NCCL (apps/mcpp/train.cpp)
  Tensor ref = iota(6);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    Tensor t = ref.clone();
    w->all_reduce(t, op).wait();
    expect_eq(t, ref);
  }
  Tensor out = Tensor::zeros({6});
  w->all_gather(out, ref).wait();
  expect_eq(out, ref);
  out.zero_();
  w->reduce_scatter(out, ref, ReduceOp::Sum).wait();
  expect_eq(out, ref);
  out.zero_();
  w->all_to_all(out, ref, {6}, {6}).wait();
  expect_eq(out, ref);
  Tensor b = ref.clone();
  w->broadcast(b, 0).wait();
  expect_eq(b, ref);
  Tensor r1 = Tensor::zeros({6}), r2 = Tensor::zeros({2});
  Tensor s2 = iota(2, 10.0f);
  w->batch_p2p({{P2POp::Kind::Send, ref, 0}, {P2POp::Kind::Recv, r1, 0}, {P2POp::Kind::Send, s2, 0},
                {P2POp::Kind::Recv, r2, 0}})
      .wait();
  expect_eq(r1, ref);
  expect_eq(r2, s2);
  Work bw = w->barrier();
  EXPECT_TRUE(bw.test());
}

TEST(LocalCommunicator, RecordsEveryCallDone) {
  CommPtr w = make_local_world(16);
  Tensor t = iota(3), out = Tensor::zeros({3});
  w->all_reduce(t, ReduceOp::Sum).wait();
  w->all_gather(out, t).wait();
  w->batch_p2p({{P2POp::Kind::Send, t, 0}, {P2POp::Kind::Recv, out, 0}}).wait();
  w->barrier().wait();
  auto e = w->recorder()->entries();
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].op, "all_reduce");
  EXPECT_EQ(e[0].seq, 1u);
  EXPECT_EQ(e[1].op, "all_gather");
  EXPECT_EQ(e[1].seq, 2u);
  EXPECT_EQ(e[2].op, "batch_p2p");
  EXPECT_EQ(e[2].p2p_seq, 1u);
  EXPECT_EQ(e[2].seq, 0u);
  EXPECT_EQ(e[3].op, "barrier");
  EXPECT_EQ(e[3].seq, 3u);
  for (const auto& x : e) {
    EXPECT_EQ(x.state, EntryState::Done) << x.op;
    EXPECT_EQ(x.group, "world");
    EXPECT_EQ(x.group_ranks, std::vector<int>{0});
  }
}

TEST(LocalCommunicator, WorkNotWaitedIsCompletedOnDestruction) {
  CommPtr w = make_local_world();
  Tensor t = iota(2);
  { Work unused = w->all_reduce(t, ReduceOp::Sum); }
  EXPECT_TRUE(w->recorder()->pending().empty());
}

TEST(LocalCommunicator, NewGroupAndCheckCollectives) {
  CommPtr w = make_local_world();
  w->set_check_collectives(true);
  CommPtr g = w->new_group("tp", {0});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->name(), "tp");
  EXPECT_TRUE(g->check_collectives()) << "groups inherit the debug mode";
  EXPECT_EQ(g->recorder(), w->recorder());
  Tensor t = iota(4);
  g->all_reduce(t, ReduceOp::Sum).wait();  // the single-rank fingerprint always agrees
  EXPECT_EQ(w->new_group("other", {3}), nullptr) << "not a member";
  EXPECT_THROW(w->new_group("pair", {0, 1}), Error);
}

// --check-collectives covers P2P: a receive whose count or dtype differs from what its peer sends is named before the
// real transfer (on one rank: a send to self and a receive from self on the same tag).
TEST(LocalCommunicator, CheckCollectivesNamesAMismatchedP2P) {
  CommPtr w = make_local_world();
  w->set_check_collectives(true);
  Tensor send = iota(4), ok = Tensor::zeros({4}), wrong = Tensor::zeros({5});
  w->batch_p2p({{P2POp::Kind::Send, send, 0, 3}, {P2POp::Kind::Recv, ok, 0, 3}}).wait();  // matching: passes
  expect_eq(ok, send);
  std::string msg;
  try {
    w->batch_p2p({{P2POp::Kind::Send, send, 0, 3}, {P2POp::Kind::Recv, wrong, 0, 3}}).wait();
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg, "--check-collectives: mismatched batch_p2p in group 'world' (seen on global rank 0, p2p_seq 2): "
                 "receiving float32 count 5 from group rank 0 (global 0) with tag 3, but that peer sends float32 count 4");
  // also recorded as failed (never pending: the watchdog does not wait on it)
  EXPECT_TRUE(w->recorder()->pending().empty());
}

TEST(LocalCommunicator, ArgumentErrorsNameTheOpAndGroup) {
  CommPtr w = make_local_world();
  Tensor f = iota(4), i32 = Tensor::zeros({4}, DType::I32), out3 = Tensor::zeros({3});
  auto msg = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(msg([&] { (void)w->all_reduce(i32, ReduceOp::Avg); }),
            "all_reduce on group 'world': ReduceOp avg needs a float dtype, got int32");
  EXPECT_EQ(msg([&] { (void)w->all_gather(out3, f); }),
            "all_gather on group 'world' (rank 0): out.numel 3 != size 1 * in.numel 4");
  EXPECT_EQ(msg([&] { (void)w->broadcast(f, 1); }), "broadcast on group 'world': root 1 outside group of size 1");
  EXPECT_EQ(msg([&] { (void)w->all_to_all(out3, f, {4}, {4}); }),
            "all_to_all on group 'world' (rank 0): recv_counts sum 4 != out.numel 3");
  EXPECT_EQ(msg([&] { (void)w->all_to_all(out3, f, {4, 0}, {3}); }),
            "all_to_all on group 'world': send_counts (2) and recv_counts (1) need one entry per rank (1)");
  EXPECT_EQ(msg([&] { (void)w->batch_p2p({{P2POp::Kind::Send, f, 0}}); }),
            "batch_p2p on local group 'world': 1 send(s) but 0 receive(s) to self with tag 0; they must pair up");
  EXPECT_EQ(msg([&] { (void)w->batch_p2p({{P2POp::Kind::Send, f, 2}}); }),
            "batch_p2p on group 'world': peer 2 outside group of size 1");
  // a refused call that got as far as the recorder is marked failed, never pending
  EXPECT_TRUE(w->recorder()->pending().empty());
  bool saw_failed = false;
  for (const auto& e : w->recorder()->entries()) saw_failed |= e.state == EntryState::Failed;
  EXPECT_TRUE(saw_failed);
}

// --flight-recorder-checksums: the payload's XXH3 before the call (an all_reduce's input), the shared result's after;
// --inject-fault corrupt-collective flips the result's lowest bit before the result checksum (the recorded checksum
// is the corrupted bytes').
TEST(LocalCommunicator, PayloadChecksumsAndResultCorruption) {
  CommPtr w = make_local_world();
  w->recorder()->set_checksums(true);
  Tensor t = Tensor::zeros({4});
  t.data<float>()[0] = 1.5f;
  const std::string in = tensor_checksum(t);
  w->all_reduce(t, ReduceOp::Sum).wait();
  auto e = w->recorder()->entries().back();
  EXPECT_EQ(e.payload_checksum, in);
  EXPECT_EQ(e.result_checksum, tensor_checksum(t));
  EXPECT_EQ(e.payload_checksum.size(), 16u);
  arm_result_corruption();
  w->all_reduce(t, ReduceOp::Sum).wait();
  e = w->recorder()->entries().back();
  EXPECT_NE(e.result_checksum, in) << "the corrupted result is recorded";
  EXPECT_EQ(e.result_checksum, tensor_checksum(t));
  uint32_t bits = 0;
  std::memcpy(&bits, t.data<float>(), 4);
  EXPECT_EQ(bits & 1u, 1u) << "the lowest bit of the first byte flipped (1.5f has it clear)";
  w->all_reduce(t, ReduceOp::Sum).wait();  // one-shot: the next result is intact
  EXPECT_EQ(w->recorder()->entries().back().result_checksum, tensor_checksum(t));
  Tensor out = Tensor::zeros({4});
  Work rs = w->reduce_scatter(out, t, ReduceOp::Sum);
  rs.wait();
  EXPECT_EQ(w->recorder()->entries().back().result_checksum, "") << "reduce_scatter's results differ per rank";
}

}  // namespace
}  // namespace mcpp::comm
