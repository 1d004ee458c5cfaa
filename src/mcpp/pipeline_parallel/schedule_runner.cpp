#include "mcpp/pipeline_parallel/schedule_runner.h"

#include <fmt/format.h>

#include <map>

#include "mcpp/core/error.h"
#include "mcpp/core/trace_range.h"

namespace mcpp::pipeline_parallel {
namespace {

using Key = std::pair<int64_t, int64_t>;  // (microbatch, chunk)
Key key_of(const TensorId& t) { return {t.microbatch, t.chunk}; }

constexpr int kActivationTag = 0;
constexpr int kGradientTag = 1;

Tensor take(std::map<Key, Tensor>& m, const Key& k, const char* what) {
  auto it = m.find(k);
  MCPP_CHECK(it != m.end(), "pipeline schedule: no {} for microbatch {} chunk {}", what, k.first, k.second);
  Tensor t = it->second;
  m.erase(it);
  return t;
}

}  // namespace

ScheduleRunResult run_schedule(const ScheduleRunArgs& a) {
  const auto& pc = *a.pc;
  const int pp = pc.pp_size(), r = pc.pp_rank();
  const int next = (r + 1) % pp, prev = (r - 1 + pp) % pp;
  std::map<Key, GPTModelCtx> ctxs;
  std::map<Key, Tensor> received_act, received_grad, outputs, input_grads;
  std::map<int64_t, MicroBatch> batches;
  ScheduleRunResult res;
  auto batch = [&](int64_t mb) -> const MicroBatch& {
    auto it = batches.find(mb);
    if (it == batches.end()) it = batches.emplace(mb, a.get_batch(mb)).first;
    return it->second;
  };

  for (const Action& act : *a.schedule) {
    const auto t0 = a.timings ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    if (act.kind == ActionKind::Forward) {
      const TraceRange range(fmt::format("fwd mb {} chunk {}", act.microbatch, act.chunk));
      GPTModel& model = *a.chunks.at(static_cast<size_t>(act.chunk));
      const Key k{act.microbatch, act.chunk};
      const MicroBatch& mb = batch(act.microbatch);
      Tensor input = model.stage().pre_process ? Tensor() : take(received_act, k, "received activation");
      GPTModelCtx& ctx = ctxs[k];
      LossResult loss;
      Tensor out = model.forward_step(ctx, mb.tokens, input, mb.labels, mb.loss_mask, a.forward,
                                      model.stage().post_process ? &loss : nullptr);
      if (model.stage().post_process) {
        res.loss_sum += loss.loss;
        res.masked_loss_sum += loss.loss_sum;
        res.num_tokens += loss.num_tokens;
      } else {
        outputs[k] = out;
      }
      res.max_in_flight = std::max<int64_t>(res.max_in_flight, static_cast<int64_t>(ctxs.size()));
      if (a.forward_only) ctxs.erase(k);
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
      if (!model.stage().pre_process) input_grads[k] = dx;
    } else {  // Comm: one batched P2P call, in Megatron's op order
      const TraceRange range("p2p");
      std::vector<comm::P2POp> ops;
      if (act.send_prev)
        ops.push_back({comm::P2POp::Kind::Send, take(input_grads, key_of(*act.send_prev), "input gradient to send"),
                       prev, kGradientTag});
      if (act.recv_prev) {
        Tensor t = Tensor::empty(a.hidden_shape, a.hidden_dtype, a.hidden_device);
        received_act[key_of(*act.recv_prev)] = t;
        ops.push_back({comm::P2POp::Kind::Recv, t, prev, kActivationTag});
      }
      if (act.send_next)
        ops.push_back({comm::P2POp::Kind::Send, take(outputs, key_of(*act.send_next), "activation to send"), next,
                       kActivationTag});
      if (act.recv_next) {
        Tensor t = Tensor::empty(a.hidden_shape, a.hidden_dtype, a.hidden_device);
        received_grad[key_of(*act.recv_next)] = t;
        ops.push_back({comm::P2POp::Kind::Recv, t, next, kGradientTag});
      }
      pc.pp()->batch_p2p(ops).wait();
    }
    if (a.timings) a.timings->push_back({act, t0, std::chrono::steady_clock::now()});
  }
  MCPP_CHECK(ctxs.empty() || a.forward_only, "pipeline schedule ended with {} forward contexts never back-propagated",
             ctxs.size());
  return res;
}

}  // namespace mcpp::pipeline_parallel
