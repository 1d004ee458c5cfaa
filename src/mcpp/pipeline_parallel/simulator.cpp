// Discrete-event execution of per-rank pipeline schedules (see simulator.h for the semantics).
#include "mcpp/pipeline_parallel/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "mcpp/core/error.h"

namespace mcpp::pipeline_parallel {

namespace {

using Key = std::pair<int64_t, int64_t>;  // (microbatch, chunk)
Key key(const TensorId& t) { return {t.microbatch, t.chunk}; }

struct OpRef {
  int64_t rank;
  size_t index;
};

// Channel = (src, dst, grads?). Each op lists its partner once pairing is done.
struct Pairing {
  std::map<std::tuple<int64_t, size_t, int>, OpRef> partner;  // (rank, action index, op slot) -> partner
};

enum Slot { kSendNext = 0, kSendPrev = 1, kRecvPrev = 2, kRecvNext = 3 };

Pairing pair_ops(const std::vector<Schedule>& sch) {
  const int64_t pp = static_cast<int64_t>(sch.size());
  struct Ep {
    OpRef ref;
    TensorId id;
  };
  std::map<std::tuple<int64_t, int64_t, int>, std::vector<Ep>> sends, recvs;  // (src, dst, grad)
  for (int64_t r = 0; r < pp; ++r) {
    const int64_t next = (r + 1) % pp, prev = (r - 1 + pp) % pp;
    for (size_t i = 0; i < sch[static_cast<size_t>(r)].size(); ++i) {
      const Action& a = sch[static_cast<size_t>(r)][i];
      if (a.kind != ActionKind::Comm) continue;
      if (pp == 1) fail("pipeline simulator: rank 0 action {} ({}) communicates with pipeline size 1", i, to_string(a));
      if (a.send_next) sends[{r, next, 0}].push_back({{r, i}, *a.send_next});
      if (a.recv_prev) recvs[{prev, r, 0}].push_back({{r, i}, *a.recv_prev});
      if (a.send_prev) sends[{r, prev, 1}].push_back({{r, i}, *a.send_prev});
      if (a.recv_next) recvs[{next, r, 1}].push_back({{r, i}, *a.recv_next});
    }
  }
  Pairing p;
  std::set<std::tuple<int64_t, int64_t, int>> channels;
  for (auto& [k, v] : sends) channels.insert(k);
  for (auto& [k, v] : recvs) channels.insert(k);
  for (const auto& ch : channels) {
    const auto& [src, dst, grad] = ch;
    const auto& s = sends[ch];
    const auto& rv = recvs[ch];
    const char* what = grad ? "grads" : "activations";
    if (s.size() != rv.size()) {
      fail("pipeline simulator: rank {} sends {} {} to rank {} but rank {} receives {}", src, s.size(), what, dst,
           dst, rv.size());
    }
    for (size_t k = 0; k < s.size(); ++k) {
      // The id the receiver should see: chunk shifts when the ring wraps.
      TensorId expect = s[k].id;
      if (!grad && src == pp - 1) expect.chunk += 1;
      if (grad && src == 0) expect.chunk -= 1;
      if (!(expect == rv[k].id)) {
        fail("pipeline simulator: {} #{} from rank {} (action {}) carries {}.{} for rank {}, but rank {} action {} "
             "expects {}.{}",
             what, k, src, s[k].ref.index, expect.microbatch, expect.chunk, dst, dst, rv[k].ref.index,
             rv[k].id.microbatch, rv[k].id.chunk);
      }
      p.partner[{src, s[k].ref.index, grad ? kSendPrev : kSendNext}] = rv[k].ref;
      p.partner[{dst, rv[k].ref.index, grad ? kRecvNext : kRecvPrev}] = s[k].ref;
    }
  }
  return p;
}

struct RankState {
  size_t pc = 0;
  double clock = 0.0;
  std::vector<double> posted;  // per action: time it was posted (-1 = not yet)
  std::set<Key> fwd_done, bwd_done, have_input, have_grad;
  int64_t in_flight = 0;
  bool has_backward = false;
  StageStats stats;
};

struct Sim {
  const std::vector<Schedule>& sch;
  const SimCosts& costs;
  int64_t pp = 0, V = 1;
  Pairing pairing{};
  std::vector<RankState> st{};

  static double cost(const std::vector<std::vector<double>>& by_stage, double uniform, int64_t r, int64_t chunk) {
    return by_stage.empty() ? uniform : by_stage[static_cast<size_t>(r)][static_cast<size_t>(chunk)];
  }

  void run_forward(int64_t r, RankState& rs, const Action& a) {
    const Key k{a.microbatch, a.chunk};
    if (rs.fwd_done.count(k)) fail("pipeline simulator: rank {} action {} runs {} twice", r, rs.pc, to_string(a));
    if (!(r == 0 && a.chunk == 0) && !rs.have_input.count(k)) {
      fail("pipeline simulator: rank {} action {} runs {} before receiving its input", r, rs.pc, to_string(a));
    }
    rs.fwd_done.insert(k);
    const double c = cost(costs.forward_by_stage, costs.forward, r, a.chunk);
    rs.clock += c;
    rs.stats.busy += c;
    if (rs.has_backward) rs.stats.max_in_flight = std::max(rs.stats.max_in_flight, ++rs.in_flight);
  }

  void run_backward(int64_t r, RankState& rs, const Action& a) {
    const Key k{a.microbatch, a.chunk};
    if (!rs.fwd_done.count(k) || rs.bwd_done.count(k)) {
      fail("pipeline simulator: rank {} action {} runs {} without its forward or twice", r, rs.pc, to_string(a));
    }
    if (!(r == pp - 1 && a.chunk == V - 1) && !rs.have_grad.count(k)) {
      fail("pipeline simulator: rank {} action {} runs {} before receiving its output grad", r, rs.pc, to_string(a));
    }
    rs.bwd_done.insert(k);
    const double c = cost(costs.backward_by_stage, costs.backward, r, a.chunk);
    rs.clock += c;
    rs.stats.busy += c;
    --rs.in_flight;
  }

  // Returns false while a counterpart op is not posted yet (the rank blocks).
  bool run_comm(int64_t r, RankState& rs, const Action& a) {
    if (a.send_next && !rs.fwd_done.count(key(*a.send_next))) {
      fail("pipeline simulator: rank {} action {} sends activation {}.{} before computing it", r, rs.pc,
           a.send_next->microbatch, a.send_next->chunk);
    }
    if (a.send_prev && !rs.bwd_done.count(key(*a.send_prev))) {
      fail("pipeline simulator: rank {} action {} sends grad {}.{} before computing it", r, rs.pc,
           a.send_prev->microbatch, a.send_prev->chunk);
    }
    double done = rs.clock;
    for (int slot : {kSendNext, kSendPrev, kRecvPrev, kRecvNext}) {
      auto it = pairing.partner.find({r, rs.pc, slot});
      if (it == pairing.partner.end()) continue;
      const double t = st[static_cast<size_t>(it->second.rank)].posted[it->second.index];
      if (t < 0) return false;
      done = std::max(done, t);
    }
    if (a.recv_prev) rs.have_input.insert(key(*a.recv_prev));
    if (a.recv_next) rs.have_grad.insert(key(*a.recv_next));
    rs.clock = done;
    return true;
  }

  // Advances rank r as far as it can go; returns whether it moved.
  bool advance(int64_t r) {
    auto& rs = st[static_cast<size_t>(r)];
    const Schedule& s = sch[static_cast<size_t>(r)];
    bool moved = false;
    while (rs.pc < s.size()) {
      const Action& a = s[rs.pc];
      if (rs.posted[rs.pc] < 0) rs.posted[rs.pc] = rs.clock;
      const double start = rs.posted[rs.pc];
      if (a.kind == ActionKind::Forward) {
        run_forward(r, rs, a);
      } else if (a.kind == ActionKind::Backward) {
        run_backward(r, rs, a);
      } else if (!run_comm(r, rs, a)) {
        break;
      }
      rs.stats.events.push_back({rs.pc, start, rs.clock});
      ++rs.pc;
      moved = true;
    }
    return moved;
  }

  void check_finished() const {
    std::string stuck;
    for (int64_t r = 0; r < pp; ++r) {
      const auto& rs = st[static_cast<size_t>(r)];
      if (rs.pc < sch[static_cast<size_t>(r)].size()) {
        stuck += fmt::format(" rank {} at action {} {};", r, rs.pc, to_string(sch[static_cast<size_t>(r)][rs.pc]));
      }
    }
    if (!stuck.empty()) fail("pipeline simulator: deadlock:{}", stuck);
    // Completeness: every rank runs every (mb, chunk) forward, and backward unless forward-only.
    int64_t M = 0;
    for (const auto& rs : st) {
      for (const Key& k : rs.fwd_done) M = std::max(M, k.first + 1);
    }
    const size_t want = static_cast<size_t>(M * V);
    for (int64_t r = 0; r < pp; ++r) {
      const auto& rs = st[static_cast<size_t>(r)];
      if (rs.fwd_done.size() != want || (rs.has_backward && rs.bwd_done.size() != want)) {
        fail("pipeline simulator: rank {} ran {} forwards and {} backwards, expected {} (M={} x V={})", r,
             rs.fwd_done.size(), rs.bwd_done.size(), want, M, V);
      }
    }
  }
};

}  // namespace

SimResult simulate(const std::vector<Schedule>& sch, const SimCosts& costs) {
  Sim sim{sch, costs};
  sim.pp = static_cast<int64_t>(sch.size());
  if (sim.pp < 1) fail("pipeline simulator: no ranks");
  for (const auto& s : sch) {
    for (const Action& a : s) {
      if (a.kind != ActionKind::Comm) sim.V = std::max(sim.V, a.chunk + 1);
    }
  }
  const auto check_shape = [&](const std::vector<std::vector<double>>& c, const char* what) {
    bool ok = c.size() == sch.size();
    for (const auto& row : c) ok = ok && static_cast<int64_t>(row.size()) == sim.V;
    if (!ok) fail("pipeline simulator: {} costs must be [pp={}][V={}], got {} ranks", what, sim.pp, sim.V, c.size());
  };
  if (costs.forward_by_stage.empty() != costs.backward_by_stage.empty())
    fail("pipeline simulator: per-stage forward and backward costs come together");
  if (!costs.forward_by_stage.empty()) {
    check_shape(costs.forward_by_stage, "per-stage forward");
    check_shape(costs.backward_by_stage, "per-stage backward");
  }
  sim.pairing = pair_ops(sch);
  sim.st.resize(sch.size());
  for (size_t r = 0; r < sch.size(); ++r) {
    sim.st[r].posted.assign(sch[r].size(), -1.0);
    for (const Action& a : sch[r]) sim.st[r].has_backward |= a.kind == ActionKind::Backward;
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t r = 0; r < sim.pp; ++r) progress |= sim.advance(r);
  }
  sim.check_finished();
  SimResult res;
  for (const auto& rs : sim.st) res.makespan = std::max(res.makespan, rs.clock);
  for (auto& rs : sim.st) {
    rs.stats.finish = rs.clock;
    rs.stats.bubble_fraction = res.makespan > 0 ? 1.0 - rs.stats.busy / res.makespan : 0.0;
    res.stages.push_back(std::move(rs.stats));
  }
  return res;
}

double theoretical_bubble_fraction(int64_t pp, int64_t num_microbatches, int64_t virtual_stages) {
  return static_cast<double>(pp - 1) / static_cast<double>(virtual_stages * num_microbatches + pp - 1);
}

}  // namespace mcpp::pipeline_parallel
