// Megatron-Core's three schedules as action lists (see schedules.h for the action model).
// The loops follow schedules.py line by line in the non-overlapped P2P mode (overlap_p2p_comm=False,
// batched P2P): the same warmup / steady / cooldown phases, the same recv flags, the same combined calls.
#include "mcpp/pipeline_parallel/schedules.h"

#include <fmt/format.h>

#include <algorithm>

#include "mcpp/core/error.h"

namespace mcpp::pipeline_parallel {

namespace {

std::string id_str(const TensorId& t) { return fmt::format("{}.{}", t.microbatch, t.chunk); }

// Builds one batched P2P call; drops it when Megatron would send and receive nothing.
void push_comm(Schedule& s, std::optional<TensorId> send_next, std::optional<TensorId> send_prev,
               std::optional<TensorId> recv_prev, std::optional<TensorId> recv_next) {
  if (!send_next && !send_prev && !recv_prev && !recv_next) return;
  Action a;
  a.kind = ActionKind::Comm;
  a.send_next = send_next;
  a.send_prev = send_prev;
  a.recv_prev = recv_prev;
  a.recv_next = recv_next;
  s.push_back(a);
}

int64_t group_size(const ScheduleOptions& opt) {
  return opt.microbatch_group_size_per_vp_stage > 0 ? opt.microbatch_group_size_per_vp_stage
                                                    : opt.pipeline_model_parallel_size;
}

}  // namespace

std::string comm_name(const Action& a) {
  if (a.kind != ActionKind::Comm) return "";
  std::string send, recv;
  if (a.send_next) send += "forward";
  if (a.send_prev) send += send.empty() ? "backward" : "_backward";
  if (a.recv_prev) recv += "forward";
  if (a.recv_next) recv += recv.empty() ? "backward" : "_backward";
  if (send.empty()) return "recv_" + recv;
  if (recv.empty()) return "send_" + send;
  return "send_" + send + "_recv_" + recv;
}

std::string to_string(const Action& a) {
  switch (a.kind) {
    case ActionKind::Forward: return fmt::format("F{}.{}", a.microbatch, a.chunk);
    case ActionKind::Backward: return fmt::format("B{}.{}", a.microbatch, a.chunk);
    case ActionKind::Comm: break;
  }
  std::string ops;
  auto add = [&](const char* tag, const std::optional<TensorId>& t) {
    if (!t) return;
    if (!ops.empty()) ops += ",";
    ops += fmt::format("{}={}", tag, id_str(*t));
  };
  add("sn", a.send_next);
  add("sp", a.send_prev);
  add("rp", a.recv_prev);
  add("rn", a.recv_next);
  return comm_name(a) + "(" + ops + ")";
}

std::string to_string(const Schedule& s) {
  std::string out;
  for (const Action& a : s) {
    if (!out.empty()) out += ' ';
    out += to_string(a);
  }
  return out;
}

ScheduleKind get_forward_backward_func(const ScheduleOptions& opt) {
  if (opt.pipeline_model_parallel_size > 1) {
    return opt.virtual_pipeline_model_parallel_size > 1 ? ScheduleKind::WithInterleaving
                                                        : ScheduleKind::WithoutInterleaving;
  }
  return ScheduleKind::NoPipelining;
}

std::string to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::NoPipelining: return "forward_backward_no_pipelining";
    case ScheduleKind::WithoutInterleaving: return "forward_backward_pipelining_without_interleaving";
    case ScheduleKind::WithInterleaving: return "forward_backward_pipelining_with_interleaving";
  }
  return "?";
}

void validate_schedule_options(const ScheduleOptions& opt) {
  const int64_t pp = opt.pipeline_model_parallel_size, M = opt.num_microbatches;
  const int64_t V = opt.virtual_pipeline_model_parallel_size;
  if (pp < 1) fail("pipeline schedule: pipeline_model_parallel_size must be >= 1, got {}", pp);
  if (opt.pipeline_model_parallel_rank < 0 || opt.pipeline_model_parallel_rank >= pp) {
    fail("pipeline schedule: pipeline_model_parallel_rank {} is outside [0, pipeline_model_parallel_size={})",
         opt.pipeline_model_parallel_rank, pp);
  }
  if (M < 1) fail("pipeline schedule: num_microbatches must be >= 1, got {}", M);
  if (V < 1) fail("pipeline schedule: virtual_pipeline_model_parallel_size must be >= 1, got {}", V);
  if (opt.microbatch_group_size_per_vp_stage < 0) {
    fail("pipeline schedule: microbatch_group_size_per_vp_stage must be >= 0 (0 = pipeline size), got {}",
         opt.microbatch_group_size_per_vp_stage);
  }
  if (V > 1 && pp == 1) {
    fail("pipeline schedule: virtual pipeline stages (virtual_pipeline_model_parallel_size={}) need "
         "pipeline_model_parallel_size > 1",
         V);
  }
  if (V == 1) return;
  const int64_t g = group_size(opt);
  if (g < pp || g > M) {
    fail("interleaved pipeline schedule: microbatch_group_size_per_vp_stage={} must lie in "
         "[pipeline_model_parallel_size={}, num_microbatches={}] (virtual stages={}); with the default group "
         "size this means num_microbatches >= pipeline_model_parallel_size",
         g, pp, M, V);
  }
  const int64_t rem = M % g;
  if (rem > 0 && rem < pp) {
    fail("interleaved pipeline schedule: num_microbatches={} leaves a last group of {} microbatches "
         "(microbatch_group_size_per_vp_stage={}), fewer than pipeline_model_parallel_size={} (virtual "
         "stages={}); use num_microbatches divisible by the group size (default: the pipeline size)",
         M, rem, g, pp, V);
  }
}

int64_t num_warmup_microbatches(const ScheduleOptions& opt) {
  validate_schedule_options(opt);
  const int64_t pp = opt.pipeline_model_parallel_size, r = opt.pipeline_model_parallel_rank;
  const int64_t M = opt.num_microbatches, V = opt.virtual_pipeline_model_parallel_size;
  switch (get_forward_backward_func(opt)) {
    case ScheduleKind::NoPipelining: return 0;
    case ScheduleKind::WithoutInterleaving: return std::min(pp - r - 1, M);
    case ScheduleKind::WithInterleaving: break;
  }
  if (opt.forward_only) return M * V;
  return std::min((pp - r - 1) * 2 + (V - 1) * group_size(opt), M * V);
}

int64_t max_activations_in_flight(const ScheduleOptions& opt) {
  if (opt.forward_only) {
    validate_schedule_options(opt);
    return 0;
  }
  const int64_t total = opt.num_microbatches * opt.virtual_pipeline_model_parallel_size;
  return std::min(num_warmup_microbatches(opt) + 1, total);
}

std::vector<TensorId> interleaved_schedule_table(int64_t num_microbatches, int64_t num_model_chunks,
                                                 int64_t microbatch_group_size_per_vp_stage) {
  std::vector<TensorId> table;
  const int64_t M = num_microbatches, g = microbatch_group_size_per_vp_stage;
  for (int64_t lo = 0; lo < M; lo += g) {
    const int64_t hi = (lo + g >= M) ? M : lo + g;  // the last group takes the remainder
    for (int64_t c = 0; c < num_model_chunks; ++c) {
      for (int64_t mb = lo; mb < hi; ++mb) table.push_back({mb, c});
    }
  }
  return table;
}

Schedule forward_backward_no_pipelining(const ScheduleOptions& opt) {
  validate_schedule_options(opt);
  if (opt.virtual_pipeline_model_parallel_size != 1) {
    fail("forward_backward_no_pipelining: model chunking is not supported (virtual_pipeline_model_parallel_size={})",
         opt.virtual_pipeline_model_parallel_size);
  }
  Schedule s;
  for (int64_t mb = 0; mb < opt.num_microbatches; ++mb) {
    s.push_back(Action::forward(mb, 0));
    if (!opt.forward_only) s.push_back(Action::backward(mb, 0));
  }
  return s;
}

Schedule forward_backward_pipelining_without_interleaving(const ScheduleOptions& opt) {
  validate_schedule_options(opt);
  if (opt.virtual_pipeline_model_parallel_size != 1) {
    fail("forward_backward_pipelining_without_interleaving: model chunking is not supported "
         "(virtual_pipeline_model_parallel_size={})",
         opt.virtual_pipeline_model_parallel_size);
  }
  const int64_t pp = opt.pipeline_model_parallel_size, r = opt.pipeline_model_parallel_rank;
  const bool first = r == 0, last = r == pp - 1;
  const int64_t warmup = num_warmup_microbatches(opt);
  const int64_t remaining = opt.num_microbatches - warmup;
  using O = std::optional<TensorId>;
  auto if_ = [](bool c, TensorId t) { return c ? O(t) : O(); };
  Schedule s;
  int64_t f = 0, b = 0;  // next microbatch to run forward / backward
  for (int64_t i = 0; i < warmup; ++i) {
    push_comm(s, {}, {}, if_(!first, {f, 0}), {});  // recv_forward
    s.push_back(Action::forward(f, 0));
    push_comm(s, if_(!last, {f, 0}), {}, {}, {});  // send_forward
    ++f;
  }
  if (remaining > 0) push_comm(s, {}, {}, if_(!first, {f, 0}), {});  // recv_forward
  for (int64_t i = 0; i < remaining; ++i) {
    const bool last_iteration = i == remaining - 1;
    s.push_back(Action::forward(f, 0));
    if (opt.forward_only) {
      push_comm(s, if_(!last, {f, 0}), {}, {}, {});  // send_forward
      ++f;
      if (!last_iteration) push_comm(s, {}, {}, if_(!first, {f, 0}), {});  // recv_forward
      continue;
    }
    push_comm(s, if_(!last, {f, 0}), {}, {}, if_(!last, {b, 0}));  // send_forward_recv_backward
    ++f;
    s.push_back(Action::backward(b, 0));
    if (last_iteration) {
      push_comm(s, {}, if_(!first, {b, 0}), {}, {});  // send_backward
    } else {
      push_comm(s, {}, if_(!first, {b, 0}), if_(!first, {f, 0}), {});  // send_backward_recv_forward
    }
    ++b;
  }
  if (!opt.forward_only) {
    for (int64_t i = 0; i < warmup; ++i) {
      push_comm(s, {}, {}, {}, if_(!last, {b, 0}));  // recv_backward
      s.push_back(Action::backward(b, 0));
      push_comm(s, {}, if_(!first, {b, 0}), {}, {});  // send_backward
      ++b;
    }
  }
  return s;
}

namespace {

// State shared by the phases of the interleaved schedule (schedules.py's closures).
struct Interleaved {
  int64_t pp, r, M, V, total;
  bool first, last;
  std::vector<TensorId> table;
  std::vector<int64_t> recv_fwd_count, recv_bwd_count;  // per chunk: tensors received so far

  int64_t chunk(int64_t k, bool forward) const {
    const int64_t c = table[static_cast<size_t>(k % total)].chunk;
    return forward ? c : V - c - 1;
  }
  int64_t microbatch(int64_t k) const { return table[static_cast<size_t>(k)].microbatch; }

  // recv_tensor_from_previous_stage: does a tensor arrive after iteration k, and for which chunk.
  std::pair<bool, int64_t> recv_from_previous(int64_t k, bool forward) const {
    const bool leading = forward ? first : last;
    const int64_t last_chunk = forward ? V - 1 : 0;
    if (!leading) return {true, chunk(k + 1, forward)};
    bool recv = true;
    int64_t next;
    if (k < pp - 1) {
      recv = false;  // the ending stage has produced nothing yet
      next = chunk(k + 1, forward);
    } else {
      next = chunk(k - (pp - 1), forward);
    }
    if (next == last_chunk) recv = false;
    next += forward ? 1 : -1;
    return {recv, next};
  }

  std::optional<TensorId> take_fwd(bool recv, int64_t c) {
    if (!recv) return {};
    return TensorId{recv_fwd_count[static_cast<size_t>(c)]++, c};
  }
  std::optional<TensorId> take_bwd(bool recv, int64_t c) {
    if (!recv) return {};
    return TensorId{recv_bwd_count[static_cast<size_t>(c)]++, c};
  }
  // Output activation of forward iteration k (None for the last chunk on the last rank).
  std::optional<TensorId> output(int64_t k) const {
    const int64_t c = chunk(k, true);
    if (c == V - 1 && last) return {};
    return TensorId{microbatch(k), c};
  }
  // Input grad of backward iteration k (None for chunk 0 on the first rank).
  std::optional<TensorId> input_grad(int64_t k) const {
    const int64_t c = chunk(k, false);
    if (c == 0 && first) return {};
    return TensorId{microbatch(k), c};
  }
};

}  // namespace

Schedule forward_backward_pipelining_with_interleaving(const ScheduleOptions& opt) {
  validate_schedule_options(opt);
  if (opt.pipeline_model_parallel_size < 2) {
    fail("forward_backward_pipelining_with_interleaving needs pipeline_model_parallel_size > 1, got {}",
         opt.pipeline_model_parallel_size);
  }
  Interleaved st;
  st.pp = opt.pipeline_model_parallel_size;
  st.r = opt.pipeline_model_parallel_rank;
  st.M = opt.num_microbatches;
  st.V = opt.virtual_pipeline_model_parallel_size;
  st.total = st.M * st.V;
  st.first = st.r == 0;
  st.last = st.r == st.pp - 1;
  st.table = interleaved_schedule_table(st.M, st.V, group_size(opt));
  st.recv_fwd_count.assign(static_cast<size_t>(st.V), 0);
  st.recv_bwd_count.assign(static_cast<size_t>(st.V), 0);
  const int64_t warmup = num_warmup_microbatches(opt);
  const bool all_warmup = warmup == st.total;
  const int64_t remaining = st.total - warmup;

  Schedule s;
  push_comm(s, {}, {}, st.take_fwd(!st.first, 0), {});  // recv_forward for chunk 0
  for (int64_t k = 0; k < warmup; ++k) {
    s.push_back(Action::forward(st.microbatch(k), st.chunk(k, true)));
    auto [recv_prev, next_chunk] = st.recv_from_previous(k, true);
    if (k == st.total - 1) recv_prev = false;
    const std::optional<TensorId> out = st.output(k);
    if (k == warmup - 1 && !opt.forward_only && !all_warmup) {
      // send_forward_backward_recv_forward_backward with no grad to send yet
      auto rp = st.take_fwd(recv_prev, next_chunk);
      push_comm(s, out, {}, rp, st.take_bwd(!st.last, st.V - 1));
    } else {
      push_comm(s, out, {}, st.take_fwd(recv_prev, next_chunk), {});  // send_forward_recv_forward
    }
  }
  for (int64_t k = 0; k < remaining; ++k) {
    const int64_t fk = k + warmup;
    s.push_back(Action::forward(st.microbatch(fk), st.chunk(fk, true)));
    s.push_back(Action::backward(st.microbatch(k), st.chunk(k, false)));
    auto [recv_prev, next_f] = st.recv_from_previous(fk, true);
    auto [recv_next, next_b] = st.recv_from_previous(k, false);
    if (k == remaining - 1) recv_prev = false;
    auto rp = st.take_fwd(recv_prev, next_f);
    auto rn = st.take_bwd(recv_next, next_b);
    push_comm(s, st.output(fk), st.input_grad(k), rp, rn);  // send_forward_backward_recv_forward_backward
  }
  if (opt.forward_only) return s;
  if (all_warmup) push_comm(s, {}, {}, {}, st.take_bwd(!st.last, st.V - 1));  // recv_backward
  for (int64_t k = remaining; k < st.total; ++k) {
    auto [recv_next, next_b] = st.recv_from_previous(k, false);
    if (k == st.total - 1) recv_next = false;
    s.push_back(Action::backward(st.microbatch(k), st.chunk(k, false)));
    push_comm(s, {}, st.input_grad(k), {}, st.take_bwd(recv_next, next_b));  // send_backward_recv_backward
  }
  return s;
}

Schedule build_schedule(const ScheduleOptions& opt) {
  switch (get_forward_backward_func(opt)) {
    case ScheduleKind::NoPipelining: return forward_backward_no_pipelining(opt);
    case ScheduleKind::WithoutInterleaving: return forward_backward_pipelining_without_interleaving(opt);
    case ScheduleKind::WithInterleaving: return forward_backward_pipelining_with_interleaving(opt);
  }
  return {};
}

std::vector<Schedule> build_all_schedules(const ScheduleOptions& opt) {
  std::vector<Schedule> all;
  for (int64_t r = 0; r < opt.pipeline_model_parallel_size; ++r) {
    ScheduleOptions o = opt;
    o.pipeline_model_parallel_rank = r;
    all.push_back(build_schedule(o));
  }
  return all;
}

}  // namespace mcpp::pipeline_parallel
