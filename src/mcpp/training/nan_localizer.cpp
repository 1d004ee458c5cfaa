// The re-run probe, the gather of the ranks' findings and the incident report (nan_localizer.h).
#include "mcpp/training/nan_localizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "mcpp/comm/communicator.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {

constexpr int64_t kHeader = 8;    // found, backward, layer, microbatch, position, pp_stage, rank, name length
constexpr int64_t kNameWords = 48;  // 384 bytes of module name
constexpr int64_t kRecord = kHeader + kNameWords;

// The causal order of findings: microbatch, forward before backward, stage (forward ascending, backward
// descending), then the position in the pass.
auto order_key(const NonFiniteFinding& f) {
  return std::make_tuple(f.microbatch, f.backward ? 1 : 0, f.backward ? -f.pp_stage : f.pp_stage, f.position, f.rank);
}

int64_t layer_of(const std::string& module) {
  constexpr std::string_view kPrefix = "decoder.layers.";
  if (module.rfind(kPrefix, 0) != 0) return -1;
  return std::strtoll(module.c_str() + kPrefix.size(), nullptr, 10);
}

std::string fmt_num(double v) { return std::isfinite(v) ? fmt::format("{:.6E}", v) : fmt::format("{}", v); }

}  // namespace

NanProbe::NanProbe(int rank, int pp_stage) : rank_(rank), pp_stage_(pp_stage) { add_scope_observer(this); }

NanProbe::~NanProbe() { remove_scope_observer(this); }

void NanProbe::on_output(const std::vector<const char*>& scopes, bool backward, const Tensor& t) {
  ++position_;
  if (finding_ || !t.defined() || (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16))
    return;
  if (!ops::has_non_finite(t)) return;
  NonFiniteFinding f;
  f.module = qualified_module_name(scopes);
  f.backward = backward;
  f.layer = layer_of(f.module);
  f.microbatch = microbatch_;
  f.position = position_;
  f.pp_stage = pp_stage_;
  f.rank = rank_;
  finding_ = f;
}

Findings gather_findings(comm::Communicator& world, const std::optional<NonFiniteFinding>& mine) {
  Tensor in = Tensor::zeros({kRecord}, DType::I64);
  int64_t* p = in.data<int64_t>();
  if (mine) {
    const size_t len = std::min(mine->module.size(), static_cast<size_t>(kNameWords * 8));
    const int64_t head[kHeader] = {1, mine->backward, mine->layer, mine->microbatch, mine->position, mine->pp_stage,
                                   mine->rank, static_cast<int64_t>(len)};
    std::copy(head, head + kHeader, p);
    std::memcpy(p + kHeader, mine->module.data(), len);
  }
  Tensor out = Tensor::empty({kRecord * world.size()}, DType::I64);
  world.host().all_gather(out, in).wait();
  Findings r;
  for (int rank = 0; rank < world.size(); ++rank) {
    const int64_t* q = out.data<int64_t>() + rank * kRecord;
    if (q[0] == 0) continue;
    NonFiniteFinding f;
    f.backward = q[1] != 0;
    f.layer = q[2];
    f.microbatch = q[3];
    f.position = q[4];
    f.pp_stage = static_cast<int>(q[5]);
    f.rank = static_cast<int>(q[6]);
    f.module.assign(reinterpret_cast<const char*>(q + kHeader), static_cast<size_t>(q[7]));
    r.all.push_back(f);
  }
  if (!r.all.empty())
    r.culprit = *std::min_element(r.all.begin(), r.all.end(),
                                  [](const auto& a, const auto& b) { return order_key(a) < order_key(b); });
  return r;
}

bool is_spiky_loss(double loss, const std::vector<double>& history, double factor) {
  if (history.empty() || !std::isfinite(loss)) return false;
  return loss > factor * *std::max_element(history.begin(), history.end());
}

namespace {
nlohmann::json to_json(const NonFiniteFinding& f) {
  return {{"rank", f.rank},   {"module", f.module},         {"tensor", f.tensor()},         {"layer", f.layer},
          {"microbatch", f.microbatch}, {"pipeline_stage", f.pp_stage}, {"position", f.position}};
}
// JSON has no NaN: a non-finite number as its string ("nan", "inf").
nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(fmt::format("{}", v)); }

nlohmann::json to_json(const std::vector<NonFiniteFinding>& fs) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& f : fs) all.push_back(to_json(f));
  return all;
}
}  // namespace

std::string CpuRerun::verdict() const {
  if (const auto& c = findings.culprit) return fmt::format("non-finite at {} {}", c->module, c->tensor());
  if (non_finite) return "non-finite (the loss or the grad norm; no module output or gradient)";
  return reproduces ? "finite, the loss spikes again" : "finite";
}

std::string CpuRerun::classification() const {
  return reproduces ? "numerics problem, reproducible in fp32 on CPU (e.g. the learning rate or the data)"
                    : "device or precision fault, not reproducible in fp32 on CPU";
}

nlohmann::json to_json(const NanIncident& i) {
  const nlohmann::json all = to_json(i.findings.all);
  nlohmann::json j = {{"event", "rerun_incident"},
                      {"iteration", i.iteration},
                      {"trigger", i.trigger},
                      {"grad_norm", num(i.grad_norm)},
                      {"loss", num(i.loss)},
                      {"rerun_grad_norm", num(i.rerun_grad_norm)},
                      {"rerun_loss", num(i.rerun_loss)},
                      {"classification", i.reproducible ? "reproducible" : "transient"},
                      {"action", "skipped"},
                      {"ranks", all}};
  if (i.trigger == "spiky_loss") j["spike_reference"] = i.spike_reference;
  j["first_non_finite"] = i.findings.culprit ? to_json(*i.findings.culprit) : nlohmann::json(nullptr);
  if (const auto& c = i.cpu) {
    j["cpu_fp32"] = c->verdict();
    nlohmann::json r = {{"state", c->state},
                        {"loss", num(c->loss)},
                        {"grad_norm", num(c->grad_norm)},
                        {"ms", c->ms},
                        {"classification", c->classification()},
                        {"first_non_finite", c->findings.culprit ? to_json(*c->findings.culprit) : nlohmann::json()},
                        {"ranks", to_json(c->findings.all)}};
    if (c->state == "checkpoint") r["checkpoint"] = c->checkpoint;
    else r["why_state"] = c->why_state;
    j["cpu_rerun"] = r;
  }
  return j;
}

std::string describe(const NanIncident& i) {
  std::string s =
      i.trigger == "spiky_loss"
          ? fmt::format(" [rerun] iteration {}: spiky loss {} (> factor x {}), re-ran the step on the same ranks: ",
                        i.iteration, fmt_num(i.loss), fmt_num(i.spike_reference))
          : fmt::format(" [rerun] iteration {}: grad norm is {} (loss {}), re-ran the step on the same ranks: ",
                        i.iteration, fmt_num(i.grad_norm), fmt_num(i.loss));
  s += i.reproducible ? "reproducible (the re-run failed the same way)"
                      : fmt::format("transient (the re-run was healthy: grad norm {}, loss {})", fmt_num(i.rerun_grad_norm),
                                    fmt_num(i.rerun_loss));
  s += "; step skipped\n";
  if (const auto& c = i.findings.culprit) {
    s += fmt::format(" [rerun] iteration {}: first non-finite tensor: {} {} (layer {}) on rank {}, microbatch {}, "
                     "pipeline stage {}",
                     i.iteration, c->module, c->tensor(), c->layer, c->rank, c->microbatch, c->pp_stage);
    std::string others;
    for (const auto& f : i.findings.all)
      if (f.rank != c->rank) others += fmt::format("{}{} ({} {})", others.empty() ? "" : ", ", f.rank, f.module, f.tensor());
    if (!others.empty()) s += "; later non-finite on ranks " + others;
    s += "\n";
  } else if (i.trigger != "spiky_loss") {
    s += fmt::format(" [rerun] iteration {}: no module produced a non-finite tensor in the re-run\n", i.iteration);
  }
  if (const auto& c = i.cpu) {
    std::string where;
    if (const auto& f = c->findings.culprit)
      where = fmt::format(" (layer {}) on rank {}, microbatch {}", f->layer, f->rank, f->microbatch);
    s += fmt::format(" [rerun] iteration {}: cpu_fp32: {}{} (loss {}, grad norm {}): {}; re-ran from {} in {:.0f} ms\n",
                     i.iteration, c->verdict(), where, fmt_num(c->loss), fmt_num(c->grad_norm), c->classification(),
                     c->state == "checkpoint" ? "the checkpoint " + c->checkpoint
                                              : "the pre-step state (" + c->why_state + ")",
                     c->ms);
  }
  return s;
}

}  // namespace mcpp
