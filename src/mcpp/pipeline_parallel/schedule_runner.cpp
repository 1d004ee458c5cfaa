#include "mcpp/pipeline_parallel/schedule_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "mcpp/core/error.h"
#include "mcpp/comm/flight_recorder.h"
#include "mcpp/core/trace_range.h"
#include "mcpp/pipeline_parallel/activation_memory.h"

namespace mcpp::pipeline_parallel {
namespace {

using Key = std::pair<int64_t, int64_t>;  // (microbatch, chunk)
Key key_of(const TensorId& t) { return {t.microbatch, t.chunk}; }

constexpr int kActivationTag = 0;
constexpr int kGradientTag = 1;
constexpr int kActivationShapeTag = 2;  // variable_seq_lengths: the shape message before each transfer
constexpr int kGradientShapeTag = 3;

Tensor shape_message(const Shape& shape) {  // [3] int64
  MCPP_CHECK(shape.size() == 3, "pipeline P2P tensors are [s, b, h], got {}", shape_str(shape));
  Tensor t = Tensor::empty({3}, DType::I64);
  for (size_t i = 0; i < 3; ++i) t.data<int64_t>()[i] = shape[i];
  return t;
}

Shape shape_of_message(const Tensor& t, int peer) {
  Shape s(t.data<int64_t>(), t.data<int64_t>() + 3);
  for (int64_t d : s)
    MCPP_CHECK(d > 0 && d < (int64_t{1} << 40), "pipeline shape message from pp rank {}: bad shape {}", peer,
               shape_str(s));
  return s;
}

Tensor take(std::map<Key, Tensor>& m, const Key& k, const char* what) {
  auto it = m.find(k);
  MCPP_CHECK(it != m.end(), "pipeline schedule: no {} for microbatch {} chunk {}", what, k.first, k.second);
  Tensor t = it->second;
  m.erase(it);
  return t;
}

}  // namespace

LossTotals loss_totals(const Tensor& loss_stats) {
  LossTotals t;
  if (!loss_stats.defined()) return t;
  const Tensor h = loss_stats.device() == Device::CPU ? loss_stats : loss_stats.to(Device::CPU);
  for (int64_t m = 0; m < h.size(0); ++m) {  // each row a microbatch's masked_loss_stats
    const LossResult r = LossResult::from_stats(h.flat_slice(2 * m, {2}));
    t.loss_sum += r.loss;
    t.masked_loss_sum += r.loss_sum;
    t.num_tokens += r.num_tokens;
  }
  return t;
}

ScheduleRunResult run_schedule(const ScheduleRunArgs& a) {
  const auto& pc = *a.pc;
  const int pp = pc.pp_size(), r = pc.pp_rank();
  const int next = (r + 1) % pp, prev = (r - 1 + pp) % pp;
  std::map<Key, GPTModelCtx> ctxs;
  std::map<Key, Tensor> received_act, received_grad, outputs, input_grads;
  std::map<int64_t, MicroBatch> batches;
  std::map<Key, size_t> held_bytes;  // context bytes right after each forward
  size_t live_bytes = 0;             // sum over the live contexts
  ScheduleRunResult res;
  const bool last_stage = a.chunks.back()->stage().post_process;
  if (last_stage) {
    int64_t num_micro = 0;
    for (const Action& act : *a.schedule) num_micro = std::max(num_micro, act.microbatch + 1);
    res.loss_stats = a.loss_stats.defined() ? a.loss_stats : Tensor::zeros({num_micro, 2}, DType::F32, a.hidden_device);
    MCPP_CHECK(res.loss_stats.ndim() == 2 && res.loss_stats.size(0) >= num_micro && res.loss_stats.size(1) == 2 &&
                   res.loss_stats.dtype() == DType::F32,
               "run_schedule: loss_stats must be float32 [num_microbatches={}, 2]; got {}", num_micro,
               res.loss_stats.str());
  }
  auto batch = [&](int64_t mb) -> const MicroBatch& {
    auto it = batches.find(mb);
    if (it == batches.end()) it = batches.emplace(mb, a.get_batch(mb)).first;
    return it->second;
  };

  comm::FlightRecorder* recorder = a.pc ? a.pc->world()->recorder() : nullptr;
  const comm::CallContext outside = recorder ? recorder->context() : comm::CallContext{};
  for (const Action& act : *a.schedule) {
    if (recorder) {  // hang forensics: the calls of this action carry its microbatch, stage and chunk
      TensorId id{act.microbatch, act.chunk};  // a Comm action: its first tensor's
      for (const auto* t : {&act.send_next, &act.send_prev, &act.recv_prev, &act.recv_next})
        if (act.kind == ActionKind::Comm && t->has_value()) {
          id = **t;
          break;
        }
      recorder->set_context({.iteration = outside.iteration, .microbatch = id.microbatch, .pp_stage = a.pc->pp_rank(),
                             .vp_chunk = id.chunk});
    }
    const auto t0 = a.timings ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const int64_t mark0 = a.timings && a.device_clock ? a.device_clock->mark() : -1;
    if (act.kind == ActionKind::Forward) {
      const TraceRange range(fmt::format("fwd mb {} chunk {}", act.microbatch, act.chunk));
      GPTModel& model = *a.chunks.at(static_cast<size_t>(act.chunk));
      const Key k{act.microbatch, act.chunk};
      const MicroBatch& mb = batch(act.microbatch);
      Tensor input = model.stage().pre_process ? Tensor() : take(received_act, k, "received activation");
      GPTModelCtx& ctx = ctxs[k];
      if (a.before_forward) a.before_forward(act.microbatch, act.chunk);
      ForwardOptions fo = a.forward;
      if (!a.forward_only) fo.loss_grad_scale = a.grad_scale;  // the backward follows: fused loss gradient
      if (mb.packed.defined()) fo.packed_seq_params = &mb.packed;
      Tensor out = model.forward_step(ctx, mb.tokens, input, mb.labels, mb.loss_mask, fo, nullptr);
      if (model.stage().post_process) {
        Tensor row = res.loss_stats.flat_slice(2 * act.microbatch, {2});
        row.copy_from(ctx.loss_stats);  // device to device, stream-ordered
      } else {
        outputs[k] = out;
      }
      res.max_in_flight = std::max<int64_t>(res.max_in_flight, static_cast<int64_t>(ctxs.size()));
      // A context is fixed from its forward to its backward; contexts of different microbatches share no
      // storage (each forward allocates its own, batches are per microbatch): the live bytes are the sum.
      const size_t bytes = context_bytes(ctx);
      held_bytes[k] = bytes;
      live_bytes += bytes;
      res.peak_activation_bytes = std::max(res.peak_activation_bytes, live_bytes);
      res.max_context_bytes = std::max(res.max_context_bytes, bytes);
      if (a.forward_only) {
        ctxs.erase(k);
        live_bytes -= bytes;
      }
    } else if (act.kind == ActionKind::Backward) {
      const TraceRange range(fmt::format("bwd mb {} chunk {}", act.microbatch, act.chunk));
      GPTModel& model = *a.chunks.at(static_cast<size_t>(act.chunk));
      const Key k{act.microbatch, act.chunk};
      auto it = ctxs.find(k);
      MCPP_CHECK(it != ctxs.end(), "pipeline schedule: backward of microbatch {} chunk {} before its forward",
                 k.first, k.second);
      Tensor grad = model.stage().post_process ? Tensor() : take(received_grad, k, "received gradient");
      if (a.before_backward) a.before_backward(act.microbatch, act.chunk);
      Tensor dx = model.backward_step(it->second, a.grad_scale, grad);
      ctxs.erase(it);
      live_bytes -= held_bytes.at(k);
      held_bytes.erase(k);
      if (!model.stage().pre_process) input_grads[k] = dx;
    } else {  // Comm: one batched P2P call, in Megatron's op order
      const TraceRange range("p2p");
      Tensor grad_out = act.send_prev ? take(input_grads, key_of(*act.send_prev), "input gradient to send") : Tensor();
      Tensor act_out = act.send_next ? take(outputs, key_of(*act.send_next), "activation to send") : Tensor();
      Shape recv_act_shape = a.hidden_shape, recv_grad_shape = a.hidden_shape;
      if (a.variable_seq_lengths) {  // the shapes first, mirroring the data ops one to one
        std::vector<comm::P2POp> shape_ops;
        // Host tensors over the PP group's host communicator (NCCL moves device buffers only).
        Tensor act_shape = Tensor::zeros({3}, DType::I64), grad_shape = Tensor::zeros({3}, DType::I64);
        if (act.send_prev) shape_ops.push_back({comm::P2POp::Kind::Send, shape_message(grad_out.shape()), prev, kGradientShapeTag});
        if (act.recv_prev) shape_ops.push_back({comm::P2POp::Kind::Recv, act_shape, prev, kActivationShapeTag});
        if (act.send_next) shape_ops.push_back({comm::P2POp::Kind::Send, shape_message(act_out.shape()), next, kActivationShapeTag});
        if (act.recv_next) shape_ops.push_back({comm::P2POp::Kind::Recv, grad_shape, next, kGradientShapeTag});
        pc.pp()->host().batch_p2p(shape_ops).wait();
        if (act.recv_prev) recv_act_shape = shape_of_message(act_shape, prev);
        if (act.recv_next) recv_grad_shape = shape_of_message(grad_shape, next);
      }
      std::vector<comm::P2POp> ops;
      if (act.send_prev) ops.push_back({comm::P2POp::Kind::Send, grad_out, prev, kGradientTag});
      if (act.recv_prev) {
        Tensor t = Tensor::empty(recv_act_shape, a.hidden_dtype, a.hidden_device);
        received_act[key_of(*act.recv_prev)] = t;
        ops.push_back({comm::P2POp::Kind::Recv, t, prev, kActivationTag});
      }
      if (act.send_next) ops.push_back({comm::P2POp::Kind::Send, act_out, next, kActivationTag});
      if (act.recv_next) {
        Tensor t = Tensor::empty(recv_grad_shape, a.hidden_dtype, a.hidden_device);
        received_grad[key_of(*act.recv_next)] = t;
        ops.push_back({comm::P2POp::Kind::Recv, t, next, kGradientTag});
      }
      pc.pp()->batch_p2p(ops).wait();
    }
    if (a.timings) {
      const int64_t mark1 = a.device_clock ? a.device_clock->mark() : -1;
      a.timings->push_back({act, t0, std::chrono::steady_clock::now(), mark0, mark1});
    }
  }
  if (recorder) recorder->set_context(outside);
  MCPP_CHECK(ctxs.empty() || a.forward_only, "pipeline schedule ended with {} forward contexts never back-propagated",
             ctxs.size());
  return res;
}

}  // namespace mcpp::pipeline_parallel
