// tools/layout_planner: the optimiser against exhaustive search over every contiguous split (the test's own
// enumeration: the oracle), the layout string against Megatron's parser (pipeline_parallel/layout.h), the costs'
// sources (a hand-made trace, JSON and CSV files) with exact numbers, and the errors naming the problem.
#include "mcpp/tools/layout_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <functional>
#include <random>

#include "mcpp/core/error.h"
#include "mcpp/pipeline_parallel/layout.h"
#include "mcpp/pipeline_parallel/schedules.h"
#include "mcpp/pipeline_parallel/simulator.h"

namespace mcpp::tools {
namespace {

LayerCosts random_costs(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<double> u(0.5, 3.0);
  LayerCosts c;
  c.source = "random";
  c.embedding = {u(rng), u(rng)};
  c.loss = {2 * u(rng), 2 * u(rng)};  // the LM head is often the heaviest item
  for (int64_t i = 0; i < n; ++i) c.layers.push_back({u(rng), 2 * u(rng)});
  c.chunk_overhead = {0.1, 0.2};
  return c;
}

// Every composition of n into s non-negative parts (the oracle's own enumeration).
std::vector<Split> all_splits(int64_t n, int64_t s) {
  std::vector<Split> out;
  Split cur;
  std::function<void(int64_t)> rec = [&](int64_t left) {
    if (static_cast<int64_t>(cur.size()) == s - 1) {
      cur.push_back(left);
      out.push_back(cur);
      cur.pop_back();
      return;
    }
    for (int64_t c = 0; c <= left; ++c) {
      cur.push_back(c);
      rec(left - c);
      cur.pop_back();
    }
  };
  rec(n);
  return out;
}

// The max over stages of F + B (+ overheads), computed directly from the split.
double max_stage_cost(const LayerCosts& c, const Split& s) {
  double worst = 0;
  size_t layer = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    double v = c.chunk_overhead.total() + (k == 0 ? c.embedding.total() : 0) + (k + 1 == s.size() ? c.loss.total() : 0);
    for (int64_t i = 0; i < s[k]; ++i) v += c.layers[layer++].total();
    worst = std::max(worst, v);
  }
  return worst;
}

TEST(LayoutPlanner, LayoutStringParsesBackToTheSplit) {
  EXPECT_EQ(layout_string({0, 4, 4, 3}), "E|t*4|t*4|t*3,L");
  EXPECT_EQ(layout_string({2, 1, 0, 3}), "E,t*2|t||t*3,L");
  EXPECT_EQ(layout_string({5}), "E,t*5,L");
  // Megatron's grammar (pipeline_parallel/layout.h) reads every split back: stage k = (vp k / pp, rank k % pp).
  for (const auto& [split, pp] : std::vector<std::pair<Split, int64_t>>{
           {{0, 4, 4, 3}, 4}, {{3, 2, 1, 2}, 2}, {{1, 2, 2, 1, 1, 0}, 2}, {{4, 4}, 2}}) {
    pipeline_parallel::LayoutOptions o;
    o.pipeline_model_parallel_size = pp;
    o.num_layers = 0;
    for (int64_t c : split) o.num_layers += c;
    o.pipeline_model_parallel_layout = layout_string(split);
    const auto L = pipeline_parallel::make_pipeline_layout(o);
    ASSERT_EQ(L.virtual_pipeline_model_parallel_size * pp, static_cast<int64_t>(split.size()));
    for (size_t k = 0; k < split.size(); ++k) {
      const auto& st = L.at(static_cast<int64_t>(k) % pp, static_cast<int64_t>(k) / pp);
      EXPECT_EQ(static_cast<int64_t>(st.layers.size()), split[k]) << o.pipeline_model_parallel_layout << " stage " << k;
      EXPECT_EQ(st.pre_process, k == 0);
      EXPECT_EQ(st.post_process, k + 1 == split.size());
    }
  }
}

TEST(LayoutPlanner, MinimaxSplitEqualsExhaustiveMinimum) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + trial % 9, s = 1 + (trial / 9) % 5;
    const LayerCosts c = random_costs(rng, n);
    double best = 1e300;
    for (const Split& sp : all_splits(n, s)) best = std::min(best, max_stage_cost(c, sp));
    const Split got = minimax_split(c, s);
    ASSERT_EQ(static_cast<int64_t>(got.size()), s);
    int64_t sum = 0;
    for (int64_t x : got) sum += x;
    ASSERT_EQ(sum, n);
    // exact: the DP takes the same sums in the same order as max_stage_cost, up to the prefix-sum rounding
    EXPECT_NEAR(max_stage_cost(c, got), best, 1e-12 * best) << "n=" << n << " s=" << s;
  }
}

TEST(LayoutPlanner, ExhaustivePlanEqualsBruteForceOverEverySplit) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t V = trial % 4 == 3 ? 2 : 1, pp = V > 1 ? 2 + trial % 2 : 2 + trial % 3;  // <= 1287 splits
    const int64_t n = pp * V + trial % (V > 1 ? 3 : 5), M = V > 1 ? pp * (1 + trial % 2) : 1 + trial % 6;
    const LayerCosts c = random_costs(rng, n);
    const LayoutPlanOptions opt{.pipeline_model_parallel_size = pp, .virtual_pipeline_model_parallel_size = V,
                                .num_microbatches = M};
    double best = 1e300;
    for (const Split& sp : all_splits(n, pp * V)) best = std::min(best, evaluate(c, sp, opt).step_ms);
    const LayoutPlan plan = plan_layout(c, opt);
    ASSERT_TRUE(plan.exhaustive);
    EXPECT_NEAR(plan.proposal.step_ms, best, 1e-9 * best) << "pp=" << pp << " V=" << V << " n=" << n << " M=" << M;
    if (plan.has_even) EXPECT_LE(plan.proposal.step_ms, plan.even.step_ms);
  }
}

TEST(LayoutPlanner, HillClimbNeverWorseThanEvenOrMinimaxAndNearTheOptimum) {
  std::mt19937 rng(13);
  int optimal = 0, trials = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t pp = 2 + trial % 3, n = 2 * pp + trial % 4, M = 2 + trial % 6;
    const LayerCosts c = random_costs(rng, n);
    const LayoutPlanOptions opt{.pipeline_model_parallel_size = pp, .num_microbatches = M, .exhaustive_limit = 0};
    const LayoutPlan plan = plan_layout(c, opt);
    ASSERT_FALSE(plan.exhaustive);
    double best = 1e300;
    std::string best_layout;
    for (const Split& sp : all_splits(n, pp)) {
      const SplitEval e = evaluate(c, sp, opt);
      if (e.step_ms < best) best = e.step_ms, best_layout = e.layout;
    }
    const double mm = evaluate(c, minimax_split(c, pp), opt).step_ms;
    EXPECT_LE(plan.proposal.step_ms, mm * (1 + 1e-12));
    if (plan.has_even) EXPECT_LE(plan.proposal.step_ms, plan.even.step_ms * (1 + 1e-12));
    // local search: within 5% of the exhaustive optimum on these shapes (measured: see the count below)
    EXPECT_LE(plan.proposal.step_ms, best * 1.05) << "pp=" << pp << " n=" << n << " M=" << M << ": "
                                                   << plan.proposal.layout << " vs the optimum " << best_layout;
    optimal += plan.proposal.step_ms <= best * (1 + 1e-9);
    ++trials;
  }
  // measured: every case reaches the exact optimum; at least 90% must (a weaker climb drops below)
  std::printf("hill climb: %d of %d cases at the exhaustive optimum\n", optimal, trials);
  EXPECT_GE(optimal, trials * 9 / 10) << optimal << " of " << trials << " optimal";
}

TEST(LayoutPlanner, HeavyLossStageGetsFewerLayers) {
  LayerCosts c;
  c.embedding = {0.1, 0.1};
  c.loss = {3, 3};  // = three layers' worth (F+B 2 each)
  c.layers.assign(8, {1, 1});
  const LayoutPlanOptions opt{.pipeline_model_parallel_size = 2, .num_microbatches = 8};
  const LayoutPlan plan = plan_layout(c, opt);
  ASSERT_TRUE(plan.has_even);
  EXPECT_EQ(plan.even.split, (Split{4, 4}));
  // the even split's loads are 8.2 / 14 ms; {5, 3} gives 10.2 / 12 and {6, 2} 12.2 / 10 (the same max): the
  // simulator picks between those two by the schedule's fill and drain
  EXPECT_TRUE(plan.proposal.split == (Split{5, 3}) || plan.proposal.split == (Split{6, 2})) << plan.proposal.layout;
  EXPECT_NEAR(plan.proposal.max_stage_ms, 12.2, 0.2 + 1e-12);
  EXPECT_LT(plan.proposal.step_ms, plan.even.step_ms);
  EXPECT_EQ(plan.proposal.layout, layout_string(plan.proposal.split));
}

TEST(LayoutPlanner, SimulatorPerStageCostsUniformMatchTheory) {
  // Per-(rank, chunk) costs all equal: the makespan of 1F1B is (M + pp - 1) (F + B), as with uniform costs.
  const int64_t pp = 4, M = 6;
  const auto sch = pipeline_parallel::build_all_schedules({.pipeline_model_parallel_size = pp, .num_microbatches = M});
  pipeline_parallel::SimCosts per;
  per.forward_by_stage.assign(pp, {1.0});
  per.backward_by_stage.assign(pp, {2.0});
  EXPECT_DOUBLE_EQ(pipeline_parallel::simulate(sch, per).makespan, (M + pp - 1) * 3.0);
  EXPECT_DOUBLE_EQ(pipeline_parallel::simulate(sch, {}).makespan, (M + pp - 1) * 3.0);
  per.backward_by_stage.pop_back();
  EXPECT_THROW(pipeline_parallel::simulate(sch, per), Error);
}

TEST(LayoutPlanner, CostsFromATraceExact) {
  // 2 steps (step 0 is warm-up and left out), M = 2, pp 2: rank 0 embedding + layer 0, rank 1 layer 1 + loss.
  nlohmann::json evs = nlohmann::json::array();
  const auto x = [&](int pid, const char* cat, const std::string& name, double ts, double dur, int step,
                     const char* pass) {
    nlohmann::json e{{"ph", "X"}, {"pid", pid}, {"tid", 0}, {"name", name}, {"cat", cat}, {"ts", ts}, {"dur", dur},
                     {"args", {{"step", step}, {"stage", pid}}}};
    if (pass) e["args"]["pass"] = pass;
    evs.push_back(e);
  };
  for (int step : {0, 1}) {
    const double w = step == 0 ? 100 : 1;  // the warm-up step is slow: must not count
    for (int mb = 0; mb < 2; ++mb) {
      const double t = step * 1e7 + mb * 1e6, tb = t + 5e5;  // the microbatch's forward, backward start
      x(0, "forward", "F", t, 1000 * w, step, nullptr);
      x(0, "layer", "embedding", t, 200 * w, step, "forward");
      x(0, "layer", "decoder.layers.0", t + 200 * w, 600 * w, step, "forward");
      x(0, "backward", "B", tb, 2400 * w, step, nullptr);
      x(0, "layer", "decoder.layers.0", tb, 1900 * w, step, "backward");
      x(0, "layer", "embedding", tb + 1900 * w, 300 * w, step, "backward");
      x(1, "forward", "F", t, 1500 * w, step, nullptr);
      x(1, "layer", "decoder.layers.1", t, 700 * w, step, "forward");
      x(1, "layer", "output_layer", t + 700 * w, 500 * w, step, "forward");
      x(1, "layer", "loss", t + 1200 * w, 100 * w, step, "forward");
      x(1, "backward", "B", tb, 3000 * w, step, nullptr);
      x(1, "layer", "loss", tb, 100 * w, step, "backward");
      x(1, "layer", "output_layer", tb + 100 * w, 700 * w, step, "backward");
      x(1, "layer", "decoder.layers.1", tb + 800 * w, 2000 * w, step, "backward");
    }
  }
  const nlohmann::json j{{"traceEvents", evs},
                         {"otherData", {{"num_microbatches", 2}, {"pipeline_model_parallel_size", 2}}}};
  const LayerCosts c = layer_costs_from_trace(parse_trace(j, "t.json"), "t.json");
  ASSERT_EQ(c.layers.size(), 2u);
  EXPECT_EQ(c.num_microbatches, 2);
  EXPECT_DOUBLE_EQ(c.embedding.forward_ms, 0.2);
  EXPECT_DOUBLE_EQ(c.embedding.backward_ms, 0.3);
  EXPECT_DOUBLE_EQ(c.layers[0].forward_ms, 0.6);
  EXPECT_DOUBLE_EQ(c.layers[1].backward_ms, 2.0);
  EXPECT_DOUBLE_EQ(c.loss.forward_ms, 0.6);
  EXPECT_DOUBLE_EQ(c.loss.backward_ms, 0.8);
  // overhead: the action's time outside its rows: rank 0 F 1000 - 800, rank 1 F 1500 - 1300 -> 0.2 ms; B 2400 -
  // 2200 and 3000 - 2800 -> 0.2 ms
  EXPECT_NEAR(c.chunk_overhead.forward_ms, 0.2, 1e-12);
  EXPECT_NEAR(c.chunk_overhead.backward_ms, 0.2, 1e-12);

  nlohmann::json bare = j;  // no layer rows
  bare["traceEvents"] = nlohmann::json::array();
  for (const auto& e : evs)
    if (e["cat"] != "layer") bare["traceEvents"].push_back(e);
  try {
    layer_costs_from_trace(parse_trace(bare, "t.json"), "t.json");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no layer events"), std::string::npos) << e.what();
  }
}

std::string write(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / ("layout_planner_test_" + name);
  std::ofstream(p) << text;
  return p.string();
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no throw, expected: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LayoutPlanner, CostsFilesAndErrors) {
  const std::string js = write("a.json", R"({"embedding": {"forward_ms": 1, "backward_ms": 2},
    "loss": {"forward_ms": 3, "backward_ms": 4}, "layers": [{"forward_ms": 5, "backward_ms": 6},
    {"forward_ms": 7, "backward_ms": 8}], "num_microbatches": 4})");
  const LayerCosts a = read_layer_costs(js);
  EXPECT_EQ(a.layers.size(), 2u);
  EXPECT_EQ(a.num_microbatches, 4);
  EXPECT_EQ(a.layers[1].backward_ms, 8);
  const std::string csv = write("a.csv", "item,forward_ms,backward_ms\nembedding,1,2\ndecoder.layers.1,7,8\n"
                                          "decoder.layers.0,5,6\nloss,3,4\noverhead,0.5,0.25\n");
  const LayerCosts b = read_layer_costs(csv);
  EXPECT_EQ(b.layers[0].forward_ms, 5);
  EXPECT_EQ(b.chunk_overhead.backward_ms, 0.25);
  expect_error([&] { read_layer_costs(write("gap.csv", "embedding,1,1\nloss,1,1\ndecoder.layers.1,1,1\n")); },
               "decoder layer 0 has no forward cost");
  expect_error([&] { read_layer_costs(write("dup.csv", "embedding,1,1\nloss,1,1\ndecoder.layers.0,1,1\n"
                                                       "decoder.layers.0,1,1\n")); },
               "appears twice");
  expect_error([&] { read_layer_costs(write("bad.csv", "embedding,1,x\n")); }, "'x' is not a number");
  expect_error([&] { read_layer_costs(write("bad.json", R"({"embedding": 1})")); }, "missing 'loss'");
  expect_error([&] { read_layer_costs("/nonexistent/costs.json"); }, "/nonexistent/costs.json");
  LayerCosts neg = a;
  neg.layers[0].forward_ms = -1;
  expect_error([&] { validate(neg, {.pipeline_model_parallel_size = 2, .num_microbatches = 2}); }, "layer 0");
  expect_error([&] { validate(a, {.pipeline_model_parallel_size = 4, .num_microbatches = 4}); },
               "exceed the 2 decoder layers");
  expect_error([&] { even_split(7, 2, 1); }, "not divisible");
}

}  // namespace
}  // namespace mcpp::tools
