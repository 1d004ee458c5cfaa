// LocalCommunicator: size-1 backend; every op is an identity or a copy and completes immediately.
#include "mcpp/comm/local/local_communicator.h"

#include <algorithm>

#include "mcpp/comm/flight_recorder.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {

namespace {
std::shared_ptr<FlightRecorder> or_new(std::shared_ptr<FlightRecorder> r, int global_rank) {
  return r ? std::move(r) : std::make_shared<FlightRecorder>(global_rank, 1);
}
void copy_unless_same(Tensor& out, const Tensor& in) {
  if (out.raw() != in.raw()) out.copy_from(in);
}
}  // namespace

LocalCommunicator::LocalCommunicator(std::string name, std::shared_ptr<FlightRecorder> recorder, int global_rank)
    : Communicator(std::move(name), {global_rank}, 0, or_new(std::move(recorder), global_rank)) {}

CommPtr LocalCommunicator::new_group(const std::string& name, const std::vector<int>& global_ranks) {
  if (std::find(global_ranks.begin(), global_ranks.end(), global_rank()) == global_ranks.end()) return nullptr;
  if (global_ranks.size() != 1) {
    fail("new_group '{}': the local (single-process) communicator has only rank {}, asked for {} ranks", name,
         global_rank(), global_ranks.size());
  }
  auto g = std::make_shared<LocalCommunicator>(name, recorder_ptr(), global_rank());
  g->set_check_collectives(check_collectives());
  return g;
}

Work LocalCommunicator::do_all_reduce(Tensor&, ReduceOp) { return Work(); }
Work LocalCommunicator::do_all_gather(Tensor& out, const Tensor& in) {
  copy_unless_same(out, in);
  return Work();
}
Work LocalCommunicator::do_reduce_scatter(Tensor& out, const Tensor& in, ReduceOp) {
  copy_unless_same(out, in);
  return Work();
}
Work LocalCommunicator::do_broadcast(Tensor&, int) { return Work(); }
Work LocalCommunicator::do_all_to_all(Tensor& out, const Tensor& in, const std::vector<int64_t>&,
                                      const std::vector<int64_t>&) {
  copy_unless_same(out, in);
  return Work();
}

Work LocalCommunicator::do_batch_p2p(const std::vector<P2POp>& ops) {
  // Sends to self pair with receives from self of the same tag, in order within each tag.
  for (int tag = 0; tag < 16; ++tag) {
    std::vector<const P2POp*> sends, recvs;
    for (const auto& o : ops)
      if (o.tag == tag) (o.kind == P2POp::Kind::Send ? sends : recvs).push_back(&o);
    if (sends.size() != recvs.size()) {
      fail("batch_p2p on local group '{}': {} send(s) but {} receive(s) to self with tag {}; they must pair up",
           name(), sends.size(), recvs.size(), tag);
    }
    for (size_t i = 0; i < sends.size(); ++i) {
      const Tensor& s = sends[i]->tensor;
      Tensor r = recvs[i]->tensor;
      if (s.numel() != r.numel() || s.dtype() != r.dtype()) {
        fail("batch_p2p on local group '{}': send #{} is {} but receive #{} is {}", name(), i, s.str(), i, r.str());
      }
      copy_unless_same(r, s);
    }
  }
  return Work();
}

Work LocalCommunicator::do_barrier() { return Work(); }

void LocalCommunicator::exchange_fingerprints(const int64_t* mine, int64_t* all, int n) {
  std::copy(mine, mine + n, all);
}

CommPtr make_local_world(size_t recorder_capacity) {
  return std::make_shared<LocalCommunicator>("world", std::make_shared<FlightRecorder>(0, 1, recorder_capacity));
}

}  // namespace mcpp::comm
