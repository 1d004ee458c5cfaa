// Profile-driven pipeline layout (see layout_planner.h): the costs' sources, the split search, the report.
#include "mcpp/tools/layout_planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/core/regular_file.h"
#include "mcpp/pipeline_parallel/schedules.h"
#include "mcpp/pipeline_parallel/simulator.h"

namespace mcpp::tools {

namespace pp_ns = pipeline_parallel;

namespace {

void check_cost(const ItemCost& c, const std::string& what, const std::string& source) {
  for (double v : {c.forward_ms, c.backward_ms})
    if (!std::isfinite(v) || v < 0) fail("{}: {} has a cost {} (want a finite number >= 0, in ms)", source, what, v);
}

pp_ns::ScheduleOptions schedule_options(const LayoutPlanOptions& opt) {
  return {.pipeline_model_parallel_size = opt.pipeline_model_parallel_size,
          .num_microbatches = opt.num_microbatches,
          .virtual_pipeline_model_parallel_size = opt.virtual_pipeline_model_parallel_size};
}

// C(n + s - 1, s - 1), saturating at limit + 1.
int64_t count_splits(int64_t n, int64_t s, int64_t limit) {
  double c = 1;
  for (int64_t i = 1; i < s; ++i) {
    c = c * static_cast<double>(n + i) / static_cast<double>(i);
    if (c > static_cast<double>(limit)) return limit + 1;
  }
  return static_cast<int64_t>(std::llround(c));
}

// Visits every composition of n into s non-negative parts, in lexicographic order of the parts.
template <class F>
void for_each_split(int64_t n, int64_t s, Split& cur, F&& f) {
  const auto k = static_cast<int64_t>(cur.size());
  if (k == s - 1) {
    cur.push_back(n);
    f(cur);
    cur.pop_back();
    return;
  }
  for (int64_t c = 0; c <= n; ++c) {
    cur.push_back(c);
    for_each_split(n - c, s, cur, f);
    cur.pop_back();
  }
}

// a better than b: lower step time, then lower max stage (relative 1e-9: the sums differ in rounding only).
bool better(const SplitEval& a, const SplitEval& b) {
  const double tol = 1e-9 * std::max(1.0, std::abs(b.step_ms));
  if (a.step_ms < b.step_ms - tol) return true;
  if (a.step_ms > b.step_ms + tol) return false;
  return a.max_stage_ms < b.max_stage_ms - 1e-9 * std::max(1.0, std::abs(b.max_stage_ms));
}

double parse_number(const std::string& v, const std::string& what) {
  double x = 0;
  size_t used = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  while (used < v.size() && std::isspace(static_cast<unsigned char>(v[used]))) ++used;
  if (used == 0 || used != v.size()) fail("{}: '{}' is not a number", what, v);
  return x;
}

ItemCost json_cost(const nlohmann::json& j, const std::string& what, const std::string& source) {
  if (!j.is_object() || !j.contains("forward_ms") || !j.contains("backward_ms") || !j["forward_ms"].is_number() ||
      !j["backward_ms"].is_number())
    fail("{}: {} must be an object with numbers forward_ms and backward_ms", source, what);
  return {j["forward_ms"].get<double>(), j["backward_ms"].get<double>()};
}

// The decoder-layer index of "decoder.layers.<i>" (-1: not one).
int64_t layer_index(const std::string& name) {
  constexpr std::string_view kPrefix = "decoder.layers.";
  if (!name.starts_with(kPrefix) || name.size() == kPrefix.size() || name.size() > kPrefix.size() + 9) return -1;
  int64_t i = 0;
  for (size_t k = kPrefix.size(); k < name.size(); ++k) {
    if (name[k] < '0' || name[k] > '9') return -1;
    i = i * 10 + (name[k] - '0');
  }
  return i;
}

// The layer table from per-index costs; every index in [0, max] must be there.
std::vector<ItemCost> dense_layers(const std::map<int64_t, ItemCost>& by_index, const std::set<int64_t>& seen_f,
                                   const std::set<int64_t>& seen_b, const std::string& source) {
  if (by_index.empty()) fail("{}: no decoder layer costs", source);
  const int64_t n = by_index.rbegin()->first + 1;
  std::vector<ItemCost> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (!seen_f.count(i) || !seen_b.count(i))
      fail("{}: decoder layer {} has no {} cost (layers 0..{} are expected, without gaps)", source, i,
           seen_f.count(i) ? "backward" : "forward", n - 1);
    out[static_cast<size_t>(i)] = by_index.at(i);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void validate(const LayerCosts& costs, const LayoutPlanOptions& opt) {
  const std::string& src = costs.source.empty() ? std::string("layer costs") : costs.source;
  if (costs.layers.empty()) fail("{}: no decoder layer costs", src);
  check_cost(costs.embedding, "the embedding", src);
  check_cost(costs.loss, "the loss", src);
  check_cost(costs.chunk_overhead, "the chunk overhead", src);
  for (size_t i = 0; i < costs.layers.size(); ++i) check_cost(costs.layers[i], fmt::format("layer {}", i), src);
  const int64_t pp = opt.pipeline_model_parallel_size, V = opt.virtual_pipeline_model_parallel_size;
  const auto n = static_cast<int64_t>(costs.layers.size());
  if (pp < 1) fail("plan layout: --pipeline-model-parallel-size must be >= 1, got {}", pp);
  if (V < 1) fail("plan layout: --virtual-pipeline-model-parallel-size must be >= 1, got {}", V);
  if (pp * V > n)
    fail("plan layout: pipeline size {} x {} virtual stage(s) = {} stages exceed the {} decoder layers of {}", pp, V,
         pp * V, n, src);
  if (opt.num_microbatches < 1) fail("plan layout: --num-microbatches must be >= 1, got {}", opt.num_microbatches);
  pp_ns::validate_schedule_options(schedule_options(opt));
}

Split even_split(int64_t num_layers, int64_t pp, int64_t vpp) {
  const int64_t s = pp * vpp;
  if (s < 1 || num_layers % s != 0)
    fail("num_layers={} is not divisible by pipeline size {} x {} virtual stage(s): no even split", num_layers, pp,
         vpp);
  return Split(static_cast<size_t>(s), num_layers / s);
}

std::string layout_string(const Split& split) {
  std::string out;
  for (size_t k = 0; k < split.size(); ++k) {
    std::vector<std::string> items;
    if (k == 0) items.emplace_back("E");
    if (split[k] == 1) items.emplace_back("t");
    if (split[k] > 1) items.push_back(fmt::format("t*{}", split[k]));
    if (k + 1 == split.size()) items.emplace_back("L");
    if (k > 0) out += '|';
    for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  }
  return out;
}

Split minimax_split(const LayerCosts& costs, int64_t stages) {
  const auto n = static_cast<int64_t>(costs.layers.size());
  const int64_t S = stages;
  MCPP_CHECK(S >= 1, "minimax_split: {} stages", S);
  std::vector<double> prefix(static_cast<size_t>(n + 1), 0.0);
  for (int64_t i = 0; i < n; ++i) prefix[static_cast<size_t>(i + 1)] = prefix[static_cast<size_t>(i)] + costs.layers[static_cast<size_t>(i)].total();
  // Stage k holding layers [a, b): its cost.
  const auto cost = [&](int64_t k, int64_t a, int64_t b) {
    double c = prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)] + costs.chunk_overhead.total();
    if (k == 0) c += costs.embedding.total();
    if (k == S - 1) c += costs.loss.total();
    return c;
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][j]: the least max over stages 0..k when they hold layers [0, j); from[k][j]: stage k's first layer.
  std::vector<std::vector<double>> best(static_cast<size_t>(S), std::vector<double>(static_cast<size_t>(n + 1), kInf));
  std::vector<std::vector<int64_t>> from(static_cast<size_t>(S), std::vector<int64_t>(static_cast<size_t>(n + 1), 0));
  for (int64_t j = 0; j <= n; ++j) best[0][static_cast<size_t>(j)] = cost(0, 0, j);
  for (int64_t k = 1; k < S; ++k) {
    for (int64_t j = 0; j <= n; ++j) {
      for (int64_t a = 0; a <= j; ++a) {  // the earliest a wins ties
        const double v = std::max(best[static_cast<size_t>(k - 1)][static_cast<size_t>(a)], cost(k, a, j));
        if (v < best[static_cast<size_t>(k)][static_cast<size_t>(j)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(j)] = v;
          from[static_cast<size_t>(k)][static_cast<size_t>(j)] = a;
        }
      }
    }
  }
  Split split(static_cast<size_t>(S), 0);
  for (int64_t k = S - 1, j = n; k >= 0; --k) {
    const int64_t a = k == 0 ? 0 : from[static_cast<size_t>(k)][static_cast<size_t>(j)];
    split[static_cast<size_t>(k)] = j - a;
    j = a;
  }
  return split;
}

SplitEval evaluate(const LayerCosts& costs, const Split& split, const LayoutPlanOptions& opt) {
  const int64_t pp = opt.pipeline_model_parallel_size, V = opt.virtual_pipeline_model_parallel_size;
  MCPP_CHECK(static_cast<int64_t>(split.size()) == pp * V, "evaluate: split of {} stages for pp {} x V {}",
             split.size(), pp, V);
  pp_ns::SimCosts sc;
  sc.forward_by_stage.assign(static_cast<size_t>(pp), std::vector<double>(static_cast<size_t>(V), 0.0));
  sc.backward_by_stage = sc.forward_by_stage;
  SplitEval ev{.split = split, .layout = layout_string(split), .rank_ms = std::vector<double>(static_cast<size_t>(pp))};
  size_t layer = 0;
  for (int64_t k = 0; k < pp * V; ++k) {
    ItemCost c = costs.chunk_overhead;
    const auto add = [&](const ItemCost& x) { c.forward_ms += x.forward_ms, c.backward_ms += x.backward_ms; };
    if (k == 0) add(costs.embedding);
    for (int64_t i = 0; i < split[static_cast<size_t>(k)]; ++i) add(costs.layers.at(layer++));
    if (k == pp * V - 1) add(costs.loss);
    const auto r = static_cast<size_t>(k % pp), v = static_cast<size_t>(k / pp);
    sc.forward_by_stage[r][v] = c.forward_ms;
    sc.backward_by_stage[r][v] = c.backward_ms;
    ev.rank_ms[r] += c.total();
  }
  MCPP_CHECK(layer == costs.layers.size(), "evaluate: split {} covers {} of {} layers", ev.layout, layer,
             costs.layers.size());
  const pp_ns::SimResult sim = pp_ns::simulate(pp_ns::build_all_schedules(schedule_options(opt)), sc);
  ev.step_ms = sim.makespan;
  size_t slowest = 0;
  for (size_t r = 0; r < sim.stages.size(); ++r) {
    if (sim.stages[r].busy > sim.stages[slowest].busy) slowest = r;
    ev.bubble_mean += sim.stages[r].bubble_fraction / static_cast<double>(sim.stages.size());
  }
  ev.bubble_slowest = sim.stages[slowest].bubble_fraction;
  ev.max_stage_ms = *std::max_element(ev.rank_ms.begin(), ev.rank_ms.end());
  return ev;
}

LayoutPlan plan_layout(const LayerCosts& costs, const LayoutPlanOptions& opt) {
  validate(costs, opt);
  const auto n = static_cast<int64_t>(costs.layers.size());
  const int64_t S = opt.pipeline_model_parallel_size * opt.virtual_pipeline_model_parallel_size;
  LayoutPlan plan;
  plan.has_even = n % S == 0;
  if (plan.has_even) plan.even = evaluate(costs, even_split(n, opt.pipeline_model_parallel_size,
                                                            opt.virtual_pipeline_model_parallel_size), opt);
  const auto consider = [&](const SplitEval& e) {
    ++plan.candidates;
    if (plan.candidates == 1 || better(e, plan.proposal)) plan.proposal = e;
  };
  if (plan.has_even) consider(plan.even);
  plan.exhaustive = count_splits(n, S, opt.exhaustive_limit) <= opt.exhaustive_limit;
  if (plan.exhaustive) {
    Split cur;
    for_each_split(n, S, cur, [&](const Split& s) {
      if (!plan.has_even || s != plan.even.split) consider(evaluate(costs, s, opt));
    });
    return plan;
  }
  // Hill climb from the even split and the minimax split (each split simulated once: a cache).
  std::map<Split, SplitEval> cache;
  const auto eval = [&](const Split& s) -> const SplitEval& {
    auto it = cache.find(s);
    if (it != cache.end()) return it->second;
    const SplitEval& e = cache.emplace(s, evaluate(costs, s, opt)).first->second;
    consider(e);
    return e;
  };
  std::vector<Split> starts;
  if (plan.has_even) starts.push_back(plan.even.split), cache.emplace(plan.even.split, plan.even);
  starts.push_back(minimax_split(costs, S));
  constexpr int64_t kMaxEvaluations = 20000;
  // Neighbours of a split: d layers taken from stage i and given to stage j (the stages between keep their counts,
  // their windows shift): any d for adjacent stages, d <= 2 otherwise.
  const auto neighbours = [S](const Split& cur) {
    std::vector<Split> out;
    for (int64_t i = 0; i < S; ++i) {
      for (int64_t j = 0; j < S; ++j) {
        const auto a = static_cast<size_t>(i), b = static_cast<size_t>(j);
        const int64_t most = i == j ? 0 : std::abs(i - j) == 1 ? cur[a] : std::min<int64_t>(2, cur[a]);
        for (int64_t d = 1; d <= most; ++d) out.push_back(cur), out.back()[a] -= d, out.back()[b] += d;
      }
    }
    return out;
  };
  for (const Split& start : starts) {
    SplitEval cur = eval(start);
    for (bool moved = true; moved && plan.candidates < kMaxEvaluations;) {
      moved = false;
      SplitEval step_best = cur;
      for (const Split& s : neighbours(cur.split)) {
        const SplitEval& e = eval(s);
        if (better(e, step_best)) step_best = e, moved = true;
      }
      cur = step_best;
    }
  }
  return plan;
}

LayerCosts layer_costs_from_trace(const Trace& trace, const std::string& source) {
  LayerCosts c;
  c.source = source;
  const auto num = [&](const char* k) -> int64_t {
    const auto& o = trace.other_data;
    return o.contains(k) && o[k].is_number_integer() ? o[k].get<int64_t>() : 0;
  };
  c.num_microbatches = num("num_microbatches");
  c.measured_pp = num("pipeline_model_parallel_size");
  if (c.num_microbatches < 1)
    fail("{}: the trace's otherData has no num_microbatches (not a `mcpp train --timeline` trace?)", source);
  std::set<int64_t> steps;
  bool any_layer = false;
  for (const TraceEvent& e : trace.events) {
    if (e.cat == EventCat::Forward || e.cat == EventCat::Backward) steps.insert(e.step);
    any_layer |= e.cat == EventCat::Layer;
  }
  if (!any_layer)
    fail("{}: the trace has no layer events (cat \"layer\"): record it with `mcpp train --timeline` on CPU ranks "
         "(GPU traces carry no layer rows), or pass --layer-costs FILE",
         source);
  if (steps.empty()) fail("{}: the trace has no forward / backward actions", source);
  const int64_t skip = steps.size() > 1 ? *steps.begin() : -2;  // the warm-up step, when there are more
  const auto kept_steps = static_cast<double>(steps.size() > 1 ? steps.size() - 1 : 1);
  const double mbs = kept_steps * static_cast<double>(c.num_microbatches);  // microbatches in the kept steps
  // Rows per (item, pass): cost per microbatch = the fastest row x rows per microbatch. The fastest row is the
  // service time (timeit's rule: contention only ever stretches a row; on oversubscribed CPU ranks most rows of a
  // millisecond-long GEMM were seen stretched 20-30x, the median with them); a recomputed forward counts twice.
  std::map<std::pair<std::string, bool>, std::vector<double>> rows;
  std::map<int64_t, std::vector<const TraceEvent*>> actions, layer_rows;  // per pid
  for (const TraceEvent& e : trace.events) {
    if (e.step == skip) continue;
    if (e.cat == EventCat::Forward || e.cat == EventCat::Backward) actions[e.pid].push_back(&e);
    if (e.cat != EventCat::Layer) continue;
    if (e.name != "embedding" && e.name != "output_layer" && e.name != "loss" && layer_index(e.name) < 0)
      fail("{}: layer event '{}' is not embedding, output_layer, loss or decoder.layers.<i>", source, e.name);
    rows[{e.name, e.backward_pass}].push_back(e.dur);
    layer_rows[e.pid].push_back(&e);
  }
  const auto cost = [&](const std::string& name, bool backward) {
    auto it = rows.find({name, backward});
    if (it == rows.end()) return -1.0;
    const double fastest = *std::min_element(it->second.begin(), it->second.end());
    return fastest * static_cast<double>(it->second.size()) / mbs / 1e3;  // us -> ms
  };
  const auto item = [&](const std::string& name) { return ItemCost{cost(name, false), cost(name, true)}; };
  const auto found = [](const ItemCost& x) { return x.forward_ms >= 0 && x.backward_ms >= 0; };
  c.embedding = item("embedding");
  const ItemCost head = item("output_layer"), loss = item("loss");
  if (!found(c.embedding) || !found(head) || !found(loss))
    fail("{}: the trace's layer events lack {} rows (forward and backward)", source,
         !found(c.embedding) ? "embedding" : !found(head) ? "output_layer" : "loss");
  c.loss = {head.forward_ms + loss.forward_ms, head.backward_ms + loss.backward_ms};
  std::map<int64_t, ItemCost> layers;
  std::set<int64_t> seen_f, seen_b;
  for (const auto& [key, durs] : rows) {
    const int64_t i = layer_index(key.first);
    if (i < 0) continue;
    (key.second ? layers[i].backward_ms : layers[i].forward_ms) = cost(key.first, key.second);
    (key.second ? seen_b : seen_f).insert(i);
  }
  c.layers = dense_layers(layers, seen_f, seen_b, source);
  // Overhead: per rank the median over its forward (backward) actions of the action's time no layer row inside it
  // covers (the median: small gaps between rows, where a stretched row's time does not land); the mean over ranks.
  double f = 0, b = 0;
  int64_t nr = 0;
  for (auto& [pid, acts] : actions) {
    auto& lr = layer_rows[pid];
    std::sort(lr.begin(), lr.end(), [](const TraceEvent* x, const TraceEvent* y) { return x->ts < y->ts; });
    std::vector<double> fo, bo;
    for (const TraceEvent* a : acts) {
      double inside = 0;
      for (auto it = std::lower_bound(lr.begin(), lr.end(), a->ts,
                                      [](const TraceEvent* x, double t) { return x->ts < t; });
           it != lr.end() && (*it)->ts + (*it)->dur <= a->ts + a->dur; ++it)
        inside += (*it)->dur;
      (a->cat == EventCat::Forward ? fo : bo).push_back(std::max(0.0, a->dur - inside));
    }
    if (fo.empty() || bo.empty()) continue;
    f += median(fo), b += median(bo), ++nr;
  }
  if (nr > 0) c.chunk_overhead = {f / static_cast<double>(nr) / 1e3, b / static_cast<double>(nr) / 1e3};
  return c;
}

LayerCosts read_layer_costs(const std::string& path) {
  LayerCosts c;
  c.source = path;
  std::map<int64_t, ItemCost> layers;
  std::set<int64_t> seen;
  if (path.ends_with(".csv")) {
    std::istringstream in(read_regular_file(path, "layer costs file", uint64_t{64} << 20));
    std::string line;
    bool have_e = false, have_l = false;
    for (int64_t ln = 1; std::getline(in, line); ++ln) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line[0] == '#') continue;
      std::vector<std::string> f;
      std::stringstream ss(line);
      for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
      if (f.size() == 3 && f[0] == "item") continue;  // the header
      const std::string where = fmt::format("{}:{}", path, ln);
      if (f.size() != 3) fail("{}: expected 'item,forward_ms,backward_ms', got {} field(s)", where, f.size());
      const ItemCost ic{parse_number(f[1], where), parse_number(f[2], where)};
      if (f[0] == "embedding") c.embedding = ic, have_e = true;
      else if (f[0] == "loss") c.loss = ic, have_l = true;
      else if (f[0] == "overhead") c.chunk_overhead = ic;
      else if (const int64_t i = layer_index(f[0]); i >= 0) {
        if (!seen.insert(i).second) fail("{}: decoder layer {} appears twice", where, i);
        layers[i] = ic;
      } else {
        fail("{}: unknown item '{}' (embedding, loss, overhead or decoder.layers.<i>)", where, f[0]);
      }
    }
    if (!have_e || !have_l) fail("{}: no '{}' row", path, have_e ? "loss" : "embedding");
  } else {
    const nlohmann::json j = read_json_file(path, "layer costs file");
    if (!j.is_object()) fail("{}: expected a JSON object", path);
    for (const char* k : {"embedding", "loss", "layers"})
      if (!j.contains(k)) fail("{}: missing '{}'", path, k);
    c.embedding = json_cost(j["embedding"], "'embedding'", path);
    c.loss = json_cost(j["loss"], "'loss'", path);
    if (j.contains("chunk_overhead")) c.chunk_overhead = json_cost(j["chunk_overhead"], "'chunk_overhead'", path);
    if (!j["layers"].is_array()) fail("{}: 'layers' must be an array of {{forward_ms, backward_ms}}", path);
    for (size_t i = 0; i < j["layers"].size(); ++i) {
      layers[static_cast<int64_t>(i)] = json_cost(j["layers"][i], fmt::format("layers[{}]", i), path);
      seen.insert(static_cast<int64_t>(i));
    }
    if (j.contains("num_microbatches")) {
      if (!j["num_microbatches"].is_number_integer()) fail("{}: 'num_microbatches' must be an integer", path);
      c.num_microbatches = j["num_microbatches"].get<int64_t>();
    }
  }
  c.layers = dense_layers(layers, seen, seen, path);
  return c;
}

std::string format_plan(const LayoutPlan& plan, const LayerCosts& costs, const LayoutPlanOptions& opt) {
  std::string out = fmt::format(
      "layer costs ({}): {} decoder layers, per microbatch: embedding {:.3f}+{:.3f} ms, layers {:.3f}..{:.3f} ms "
      "(F+B), loss {:.3f}+{:.3f} ms, chunk overhead {:.3f}+{:.3f} ms\n",
      costs.source, costs.layers.size(), costs.embedding.forward_ms, costs.embedding.backward_ms,
      std::min_element(costs.layers.begin(), costs.layers.end(),
                       [](const ItemCost& a, const ItemCost& b) { return a.total() < b.total(); })->total(),
      std::max_element(costs.layers.begin(), costs.layers.end(),
                       [](const ItemCost& a, const ItemCost& b) { return a.total() < b.total(); })->total(),
      costs.loss.forward_ms, costs.loss.backward_ms, costs.chunk_overhead.forward_ms, costs.chunk_overhead.backward_ms);
  out += fmt::format("pipeline: pp {} x vpp {}, {} microbatches; {} split(s) simulated ({})\n",
                     opt.pipeline_model_parallel_size, opt.virtual_pipeline_model_parallel_size, opt.num_microbatches,
                     plan.candidates, plan.exhaustive ? "all: exact" : "minimax + hill climb");
  out += fmt::format("{:<9} {:>13} {:>13} {:>16} {:>13}  {}\n", "split", "max stage ms", "step ms (sim)",
                     "bubble slowest", "bubble mean", "layout");
  const auto row = [&](const char* name, const SplitEval& e) {
    out += fmt::format("{:<9} {:>13.3f} {:>13.3f} {:>16.3f} {:>13.3f}  {}\n", name, e.max_stage_ms, e.step_ms,
                       e.bubble_slowest, e.bubble_mean, e.layout);
  };
  if (plan.has_even) row("even", plan.even);
  else out += fmt::format("even      (none: {} layers do not split evenly over {} stages)\n", costs.layers.size(),
                          opt.pipeline_model_parallel_size * opt.virtual_pipeline_model_parallel_size);
  row("proposal", plan.proposal);
  const std::string per_rank = fmt::format("{:.3f}", fmt::join(plan.proposal.rank_ms, " / "));
  out += fmt::format("proposal per rank (F+B ms per microbatch): {}\n", per_rank);
  if (plan.has_even && plan.proposal.split == plan.even.split) {
    out += "the even split is already the best found: keep it\n";
    const int64_t V = opt.virtual_pipeline_model_parallel_size;
    out += fmt::format("flags: --pipeline-model-parallel-size {}{}\n", opt.pipeline_model_parallel_size,
                       V > 1 ? fmt::format(" --num-layers-per-virtual-pipeline-stage {}", plan.even.split[0]) : "");
  } else {
    if (plan.has_even)
      out += fmt::format("predicted step time: {:.3f} ms -> {:.3f} ms ({:+.1f}%)\n", plan.even.step_ms,
                         plan.proposal.step_ms, 100.0 * (plan.proposal.step_ms / plan.even.step_ms - 1.0));
    out += fmt::format("flags: --pipeline-model-parallel-size {} --pipeline-model-parallel-layout \"{}\"\n",
                       opt.pipeline_model_parallel_size, plan.proposal.layout);
  }
  return out;
}

}  // namespace mcpp::tools
