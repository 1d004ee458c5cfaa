// Mixture of experts on CPU (one rank): the row-movement ops against a direct float64 reference, and the whole
// MoELayer (router, dropless dispatch, experts, load-balancing losses) against the PyTorch oracle
// tests/oracle/moe_ref.py (float64, autograd), forward and every gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "kernels/grad_check.h"
#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/error.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/moe/moe_layer.h"
#include "models/gpt_test_util.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp {
namespace {
using mcpp::testing::random_tensor;

Tensor routes(const std::vector<int32_t>& v, int64_t n, int64_t k) {
  Tensor t = Tensor::empty({n, k}, DType::I32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

TEST(MoeOps, PermuteUnpermuteAndBackwardMatchTheDefinitions) {
  const int64_t n = 5, k = 2, h = 7, m = n * k;
  const std::vector<int32_t> idx = {3, 0, 7, 1, 9, 2, 4, 8, 5, 6};  // a permutation of 0..9
  Tensor ix = routes(idx, n, k);
  Tensor x = random_tensor({n, h}, 1), in = random_tensor({m, h}, 2), dy = random_tensor({n, h}, 3);
  Tensor w = random_tensor({n, k}, 4);
  Tensor out = Tensor::zeros({m, h});
  ops::moe_permute(out, x, ix);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < k; ++i)
      for (int64_t c = 0; c < h; ++c)
        EXPECT_EQ(out.data<float>()[idx[static_cast<size_t>(t * k + i)] * h + c], x.data<float>()[t * h + c]);
  Tensor y = Tensor::empty({n, h}), y1 = Tensor::empty({n, h});
  ops::moe_unpermute(y, in, ix, &w);
  ops::moe_unpermute(y1, in, ix, nullptr);
  Tensor din = Tensor::zeros({m, h}), dw = Tensor::empty({n, k});
  ops::moe_unpermute_bwd(din, dw, dy, in, ix, w);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < h; ++c) {
      double want = 0, want1 = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double v = in.data<float>()[idx[static_cast<size_t>(t * k + i)] * h + c];
        want += w.data<float>()[t * k + i] * v;
        want1 += v;
      }
      EXPECT_NEAR(y.data<float>()[t * h + c], want, 1e-6);
      EXPECT_NEAR(y1.data<float>()[t * h + c], want1, 1e-6);
    }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = idx[static_cast<size_t>(t * k + i)];
      double dot = 0;
      for (int64_t c = 0; c < h; ++c) {
        dot += static_cast<double>(dy.data<float>()[t * h + c]) * in.data<float>()[j * h + c];
        EXPECT_FLOAT_EQ(din.data<float>()[j * h + c], w.data<float>()[t * k + i] * dy.data<float>()[t * h + c]);
      }
      EXPECT_NEAR(dw.data<float>()[t * k + i], dot, 1e-5);
    }
}

TEST(MoeOps, BadRoutesAreNamedErrors) {
  Tensor x = random_tensor({2, 4}, 1), out = Tensor::zeros({4, 4});
  Tensor bad = routes({0, 1, 2, 4}, 2, 2);  // 4 is not a row of out
  try {
    ops::moe_permute(out, x, bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("idx entry 3 = 4 is not a row of out"), std::string::npos) << e.what();
  }
  Tensor wrong_h = Tensor::zeros({4, 5});
  EXPECT_THROW(ops::moe_permute(wrong_h, x, routes({0, 1, 2, 3}, 2, 2)), Error);
}

// The router ops on the CPU against their definitions: top-k (descending, ties to the lower expert), softmaxes,
// logsumexp, the expert-major route positions.
TEST(MoeOps, TopkSoftmaxAndRoutePositionsMatchTheDefinitions) {
  const int64_t n = 4, e = 5, k = 2;
  const std::vector<float> lg = {0.5f, 2.0f, -1.0f, 2.0f, 0.0f,    // a tie: experts 1 and 3 -> 1 first
                                 3.0f, 1.0f, 0.0f, -2.0f, 2.5f,    //
                                 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,     // all equal: 0, 1
                                 -1.0f, -2.0f, -3.0f, 4.0f, 1.0f};
  Tensor logits = Tensor::empty({n, e});
  std::copy(lg.begin(), lg.end(), logits.data<float>());
  for (bool pre : {false, true}) {
    SCOPED_TRACE(pre);
    Tensor topk = Tensor::empty({n, k}, DType::I32), probs = Tensor::empty({n, k}), scores = Tensor::empty({n, e});
    Tensor lse = Tensor::empty({n});
    ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.pre_softmax = pre});
    const std::vector<int32_t> want_top = {1, 3, 0, 4, 0, 1, 3, 4};
    for (int64_t q = 0; q < n * k; ++q) EXPECT_EQ(topk.data<int32_t>()[q], want_top[static_cast<size_t>(q)]) << q;
    for (int64_t t = 0; t < n; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < e; ++j) sum += std::exp(static_cast<double>(lg[static_cast<size_t>(t * e + j)]));
      EXPECT_NEAR(lse.data<float>()[t], std::log(sum), 1e-6);
      for (int64_t j = 0; j < e; ++j)
        EXPECT_NEAR(scores.data<float>()[t * e + j], std::exp(lg[static_cast<size_t>(t * e + j)]) / sum, 1e-7);
      const int32_t a = want_top[static_cast<size_t>(t * k)], b = want_top[static_cast<size_t>(t * k + 1)];
      const double la = lg[static_cast<size_t>(t * e + a)], lb = lg[static_cast<size_t>(t * e + b)];
      const double pa = pre ? std::exp(la) / sum : 1.0 / (1.0 + std::exp(lb - la));
      const double pb = pre ? std::exp(lb) / sum : 1.0 / (1.0 + std::exp(la - lb));
      EXPECT_NEAR(probs.data<float>()[t * k], pa, 1e-7);
      EXPECT_NEAR(probs.data<float>()[t * k + 1], pb, 1e-7);
    }
    Tensor idx = Tensor::empty({n, k}, DType::I32), counts = Tensor::empty({e}, DType::I64);
    ops::moe_route_positions(idx, counts, topk);
    const std::vector<int64_t> want_counts = {2, 2, 0, 2, 2};  // experts 0,1,3,4
    const std::vector<int32_t> want_idx = {2, 4, 0, 6, 1, 3, 5, 7};  // expert-major, tokens in order
    for (int64_t j = 0; j < e; ++j) EXPECT_EQ(counts.data<int64_t>()[j], want_counts[static_cast<size_t>(j)]);
    for (int64_t q = 0; q < n * k; ++q) EXPECT_EQ(idx.data<int32_t>()[q], want_idx[static_cast<size_t>(q)]) << q;
  }
}

// moe_route_counts: per row g the routes of the tokens t % G == g, every route or only the kept ones (idx >= 0).
TEST(MoeOps, RouteCountsPerRowAndKept) {
  const int64_t n = 5, k = 2, e = 3;
  Tensor topk = Tensor::empty({n, k}, DType::I32), idx = Tensor::empty({n, k}, DType::I32);
  const std::vector<int32_t> top = {0, 2, 1, 2, 2, 0, 0, 1, 2, 1}, rows = {0, 5, 3, -1, 6, 1, 2, 4, -1, -1};
  std::copy(top.begin(), top.end(), topk.data<int32_t>());
  std::copy(rows.begin(), rows.end(), idx.data<int32_t>());
  Tensor all = Tensor::empty({1, e}), by_seq = Tensor::empty({2, e}), kept = Tensor::empty({2, e});
  ops::moe_route_counts(all, topk, nullptr);
  ops::moe_route_counts(by_seq, topk, nullptr);
  ops::moe_route_counts(kept, topk, &idx);
  EXPECT_EQ(testing::to_doubles(all), (std::vector<double>{3, 3, 4}));
  // tokens 0, 2, 4 (row 0): {0,2} {2,0} {2,1}; tokens 1, 3 (row 1): {1,2} {0,1}
  EXPECT_EQ(testing::to_doubles(by_seq), (std::vector<double>{2, 1, 3, 1, 2, 1}));
  // dropped: token 1's expert 2, token 4's both
  EXPECT_EQ(testing::to_doubles(kept), (std::vector<double>{2, 0, 2, 1, 2, 0}));
  Tensor bad = Tensor::empty({1, 2});  // topk names expert 2
  EXPECT_THROW(ops::moe_route_counts(bad, topk, nullptr), Error);
}

// The router backward's load-balancing gradient per sequence (seq_aux_loss): aux_grad [G, E], token t reading row
// t % G; dlogits[t] = s (g - <s, g>) with no dprobs. [E] is one row; other shapes are named errors.
TEST(MoeOps, AuxGradRowsFollowTheTokensSequence) {
  const int64_t n = 6, e = 4, k = 2, g = 3;
  Tensor logits = random_tensor({n, e}, 31);
  Tensor topk = Tensor::empty({n, k}, DType::I32), probs = Tensor::empty({n, k}), scores = Tensor::empty({n, e});
  Tensor lse = Tensor::empty({n});
  ops::moe_topk_softmax(topk, probs, scores, lse, logits, {});
  Tensor dprobs = Tensor::zeros({n, k}), aux = random_tensor({g, e}, 32), dl = Tensor::empty({n, e});
  ops::moe_topk_softmax_bwd(dl, dprobs, probs, topk, scores, lse, aux, {});
  for (int64_t t = 0; t < n; ++t) {
    const float *sc = scores.data<float>() + t * e, *row = aux.data<float>() + (t % g) * e;
    double sg = 0.0;
    for (int64_t j = 0; j < e; ++j) sg += static_cast<double>(sc[j]) * row[j];
    for (int64_t j = 0; j < e; ++j) EXPECT_NEAR(dl.data<float>()[t * e + j], sc[j] * (row[j] - sg), 1e-6) << t;
  }
  Tensor one_row = aux.flat_slice(0, {e}).clone(), dl1 = Tensor::empty({n, e}), aux1 = Tensor::empty({1, e});
  aux1.copy_from(one_row.view({1, e}));
  ops::moe_topk_softmax_bwd(dl, dprobs, probs, topk, scores, lse, one_row, {});
  ops::moe_topk_softmax_bwd(dl1, dprobs, probs, topk, scores, lse, aux1, {});
  EXPECT_EQ(std::memcmp(dl.raw(), dl1.raw(), dl.nbytes()), 0);  // [E] = [1, E]
  for (const Shape& bad : {Shape{e + 1}, Shape{2, e - 1}, Shape{0, e}, Shape{2, 2, e}}) {
    Tensor a = Tensor::zeros(bad);
    try {
      ops::moe_topk_softmax_bwd(dl, dprobs, probs, topk, scores, lse, a, {});
      ADD_FAILURE() << "aux_grad " << shape_str(bad) << " accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("aux_grad"), std::string::npos) << err.what();
    }
  }
}

// Group-limited routing and the sigmoid score function, worked by hand: 6 experts in 3 groups of 2, top-2 from the
// best group (group_topk 1, each group scored by its k / group_topk = 2 largest values summed).
TEST(MoeOps, GroupLimitedTopkAndSigmoidMatchTheDefinitions) {
  const int64_t n = 2, e = 6, k = 2;
  const std::vector<float> lg = {5.0f, -4.0f, 1.0f, 1.5f, 0.0f, 0.5f,   // sums 1.0 / 2.5 / 0.5: group 1 = {2, 3},
                                 0.0f, 0.0f, 2.0f, -9.0f, 1.0f, 1.0f};  // though expert 0 is the best; 0 / -7 / 2
  Tensor logits = Tensor::empty({n, e});
  std::copy(lg.begin(), lg.end(), logits.data<float>());
  Tensor topk = Tensor::empty({n, k}, DType::I32), probs = Tensor::empty({n, k}), scores = Tensor::empty({n, e});
  Tensor lse = Tensor::empty({n});
  ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.num_groups = 3, .group_topk = 1});
  const std::vector<int32_t> want = {3, 2, 4, 5};  // token 1: a tie inside group 2 -> the lower expert first
  for (int64_t q = 0; q < n * k; ++q) EXPECT_EQ(topk.data<int32_t>()[q], want[static_cast<size_t>(q)]) << q;
  EXPECT_NEAR(probs.data<float>()[0], 1.0 / (1.0 + std::exp(-0.5)), 1e-7);  // softmax over the two chosen
  // sigmoid: group scores are sums of sigmoids (monotone: the same groups here); probs = s / (s_a + s_b)
  ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.sigmoid = true, .num_groups = 3, .group_topk = 1});
  for (int64_t q = 0; q < n * k; ++q) EXPECT_EQ(topk.data<int32_t>()[q], want[static_cast<size_t>(q)]) << q;
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  EXPECT_NEAR(probs.data<float>()[0], sig(1.5) / (sig(1.5) + sig(1.0)), 1e-7);
  EXPECT_NEAR(probs.data<float>()[3], 0.5, 1e-7);
  double z = 1e-20;
  for (int64_t j = 0; j < e; ++j) z += sig(lg[static_cast<size_t>(j)]);
  EXPECT_NEAR(lse.data<float>()[0], z, 1e-6);  // the aux loss's normalizer
  EXPECT_NEAR(scores.data<float>()[0], sig(5.0) / z, 1e-7);
  // two groups of three, group_topk 2 = no limit: the plain top-2
  ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.num_groups = 2, .group_topk = 2});
  EXPECT_EQ(topk.data<int32_t>()[0], 0);
  EXPECT_EQ(topk.data<int32_t>()[1], 3);
  // an expert bias (sigmoid only) chooses by s + b — expert 4 (s 0.5) over expert 3 (s 0.82) — probs from s
  Tensor bias = Tensor::zeros({e});
  bias.data<float>()[4] = 0.4f;
  ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.sigmoid = true, .expert_bias = bias});
  EXPECT_EQ(topk.data<int32_t>()[0], 0);
  EXPECT_EQ(topk.data<int32_t>()[1], 4);
  EXPECT_NEAR(probs.data<float>()[1], sig(0.0) / (sig(0.0) + sig(5.0)), 1e-7);
  EXPECT_THROW(ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.expert_bias = bias}), Error);  // softmax
  EXPECT_THROW(ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.num_groups = 4, .group_topk = 1}), Error);
  EXPECT_THROW(ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.num_groups = 3, .group_topk = 3}), Error);
  EXPECT_THROW(ops::moe_topk_softmax(topk, probs, scores, lse, logits, {.pre_softmax = true, .sigmoid = true}),
               Error);
}

// Capacity (Megatron's topk_softmax_with_capacity): 6 tokens x top-2 over 3 experts, capacity 3.
TEST(MoeOps, CapacityPositionsDropByProbsOrPosition) {
  const int64_t n = 6, k = 2, e = 3;
  // routes q = t*k + i: expert 0 is chosen by 5 routes, expert 1 by 4, expert 2 by 3 (= capacity)
  const std::vector<int32_t> top = {0, 1, 0, 2, 1, 0, 0, 2, 1, 0, 2, 1};
  const std::vector<float> pr = {0.6f, 0.4f, 0.5f, 0.5f, 0.7f, 0.3f, 0.9f, 0.1f, 0.2f, 0.8f, 0.55f, 0.45f};
  Tensor topk = routes(top, n, k), probs = Tensor::empty({n, k});
  std::copy(pr.begin(), pr.end(), probs.data<float>());
  Tensor idx = Tensor::empty({n, k}, DType::I32), counts = Tensor::empty({e}, DType::I64);
  ops::moe_route_positions(idx, counts, topk);
  ASSERT_EQ(counts.data<int64_t>()[0], 5);
  struct Want {
    bool by_probs, pad;
    std::vector<int32_t> idx;
    std::vector<int64_t> kept;
  };
  // expert 0's routes q = 0 (0.6), 2 (0.5), 5 (0.3), 6 (0.9), 9 (0.8): by probs keep 0, 6, 9; by position 0, 2, 5.
  // expert 1's routes q = 1 (0.4), 4 (0.7), 8 (0.2), 11 (0.45): by probs keep 1, 4, 11; by position 1, 4, 8.
  for (const Want& w : {Want{true, false, {0, 3, -1, 6, 4, -1, 1, 7, -1, 2, 8, 5}, {3, 3, 3}},
                        Want{false, false, {0, 3, 1, 6, 4, 2, -1, 7, 5, -1, 8, -1}, {3, 3, 3}},
                        Want{true, true, {0, 3, -1, 6, 4, -1, 1, 7, -1, 2, 8, 5}, {3, 3, 3}}}) {
    SCOPED_TRACE(std::string(w.by_probs ? "probs" : "position") + (w.pad ? " pad" : ""));
    Tensor out = Tensor::empty({n, k}, DType::I32), kept = Tensor::empty({e}, DType::I64);
    ops::moe_capacity_positions(out, kept, topk, probs, counts, {.capacity = 3, .by_probs = w.by_probs, .pad = w.pad});
    for (int64_t q = 0; q < n * k; ++q) EXPECT_EQ(out.data<int32_t>()[q], w.idx[static_cast<size_t>(q)]) << q;
    for (int64_t j = 0; j < e; ++j) EXPECT_EQ(kept.data<int64_t>()[j], w.kept[static_cast<size_t>(j)]);
  }
  // capacity 4, padded: expert 1 keeps all 4, expert 2 its 3 in a block of 4 (rows 8..11, row 11 padding)
  Tensor out = Tensor::empty({n, k}, DType::I32), kept = Tensor::empty({e}, DType::I64);
  ops::moe_capacity_positions(out, kept, topk, probs, counts, {.capacity = 4, .by_probs = true, .pad = true});
  const std::vector<int32_t> want = {0, 4, 1, 8, 5, -1, 2, 9, 6, 3, 10, 7};  // expert 0 drops q = 5 (0.3)
  for (int64_t q = 0; q < n * k; ++q) EXPECT_EQ(out.data<int32_t>()[q], want[static_cast<size_t>(q)]) << q;
  EXPECT_EQ(kept.data<int64_t>()[2], 3);
  // ties: equal probabilities keep the earlier routes
  Tensor flat = Tensor::empty({n, k});
  flat.fill_(0.5f);
  ops::moe_capacity_positions(out, kept, topk, flat, counts, {.capacity = 3, .by_probs = true});
  EXPECT_EQ(out.data<int32_t>()[5], 2);   // expert 0's third route (q = 5) stays
  EXPECT_EQ(out.data<int32_t>()[6], -1);  // its fourth (q = 6) drops
}

// Dropped routes (idx -1) move nothing and weigh nothing.
TEST(MoeOps, DroppedRoutesMoveNothing) {
  const int64_t n = 3, k = 2, h = 4, m = 4;
  Tensor ix = routes({0, -1, 1, 2, -1, 3}, n, k);
  Tensor x = random_tensor({n, h}, 1), in = random_tensor({m, h}, 2), dy = random_tensor({n, h}, 3);
  Tensor w = random_tensor({n, k}, 4);
  Tensor out = Tensor::zeros({m, h});
  ops::moe_permute(out, x, ix);
  EXPECT_EQ(out.data<float>()[0 * h], x.data<float>()[0]);
  EXPECT_EQ(out.data<float>()[3 * h], x.data<float>()[2 * h]);
  Tensor y = Tensor::empty({n, h});
  ops::moe_unpermute(y, in, ix, &w);
  for (int64_t c = 0; c < h; ++c) {
    EXPECT_FLOAT_EQ(y.data<float>()[c], w.data<float>()[0] * in.data<float>()[c]);  // token 0: its route 0 only
    EXPECT_FLOAT_EQ(y.data<float>()[2 * h + c], w.data<float>()[5] * in.data<float>()[3 * h + c]);
  }
  Tensor din = Tensor::zeros({m, h}), dw = Tensor::empty({n, k});
  dw.fill_(7.0f);
  ops::moe_unpermute_bwd(din, dw, dy, in, ix, w);
  EXPECT_EQ(dw.data<float>()[1], 0.0f);
  EXPECT_EQ(dw.data<float>()[4], 0.0f);
  EXPECT_NE(dw.data<float>()[0], 0.0f);
}

struct MoeCase {
  std::string style;  // "gpt2": GELU + biases; "llama": SwiGLU, no biases
  bool pre_softmax = false;
  float aux = 0.0f, z = 0.0f;
  int64_t experts = 4, topk = 2, ffn = 24;
  int64_t shared = 0;  // the shared expert's width (0: none)
  double capacity = 0.0;  // --moe-expert-capacity-factor (0: dropless)
  std::string policy = "probs";
  bool pad = false;
  float scaling = 0.0f;  // --moe-router-topk-scaling-factor
  std::string score = "softmax";  // --moe-router-score-function
  int64_t groups = 0, group_topk = 0;  // --moe-router-num-groups / --moe-router-group-topk
  bool bias = false;  // --moe-router-enable-expert-bias (a random bias set before the forward)
  std::string balancing = "aux_loss";  // --moe-router-load-balancing-type
  int64_t batch = 2;                   // the sequences of the 12 tokens
  bool shared_gate = false;            // --moe-shared-expert-gate
  float jitter = 0.0f;                 // --moe-input-jitter-eps
  bool force = false;                  // --moe-router-force-load-balancing
};

void write_raw(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

TEST(MoELayer, MatchesTorchOracle) {
  for (const MoeCase& mc : {MoeCase{.style = "gpt2", .aux = 0.01f, .z = 0.001f},
                            MoeCase{.style = "llama", .pre_softmax = true, .aux = 0.1f},
                            MoeCase{.style = "gpt2", .experts = 8, .topk = 3, .ffn = 16},
                            MoeCase{.style = "gpt2", .aux = 0.01f, .shared = 40},
                            MoeCase{.style = "llama", .z = 0.01f, .experts = 6, .shared = 20},
                            MoeCase{.style = "gpt2", .aux = 0.01f, .capacity = 0.75},
                            MoeCase{.style = "llama", .pre_softmax = true, .capacity = 0.75, .policy = "position",
                                    .pad = true},
                            MoeCase{.style = "gpt2", .experts = 8, .topk = 3, .ffn = 16, .capacity = 1.0, .pad = true},
                            MoeCase{.style = "llama", .aux = 0.1f, .shared = 20, .capacity = 0.5,
                                    .policy = "position"},
                            MoeCase{.style = "gpt2", .aux = 0.01f, .z = 0.001f, .topk = 3, .capacity = 1.0,
                                    .scaling = 2.5f},
                            MoeCase{.style = "llama", .pre_softmax = true, .experts = 6, .scaling = 16.0f},
                            // DeepSeek-V3's router: sigmoid scores, group-limited, routed scaling, aux loss
                            MoeCase{.style = "gpt2", .aux = 0.01f, .score = "sigmoid"},
                            MoeCase{.style = "llama", .aux = 0.1f, .topk = 1, .score = "sigmoid"},
                            MoeCase{.style = "llama", .aux = 0.01f, .experts = 8, .topk = 4, .ffn = 16,
                                    .scaling = 2.5f, .score = "sigmoid", .groups = 4, .group_topk = 2},
                            MoeCase{.style = "gpt2", .aux = 0.01f, .z = 0.001f, .experts = 8, .topk = 2, .ffn = 16,
                                    .groups = 4, .group_topk = 1},
                            MoeCase{.style = "llama", .pre_softmax = true, .aux = 0.1f, .experts = 6, .topk = 3,
                                    .groups = 3, .group_topk = 2},
                            MoeCase{.style = "gpt2", .aux = 0.01f, .experts = 8, .topk = 3, .ffn = 16, .capacity = 0.75,
                                    .score = "sigmoid", .groups = 2, .group_topk = 1},
                            MoeCase{.style = "llama", .aux = 0.01f, .experts = 8, .topk = 2, .ffn = 16,
                                    .score = "sigmoid", .groups = 4, .group_topk = 2, .bias = true},
                            MoeCase{.style = "gpt2", .experts = 6, .topk = 2, .ffn = 16, .scaling = 2.5f,
                                    .score = "sigmoid", .bias = true},
                            // DeepSeek's sequence-wise balancing loss: per sequence of the micro batch
                            MoeCase{.style = "gpt2", .aux = 0.01f, .z = 0.001f, .balancing = "seq_aux_loss",
                                    .batch = 3},
                            MoeCase{.style = "llama", .aux = 0.1f, .experts = 8, .topk = 3, .ffn = 16,
                                    .capacity = 0.75, .balancing = "seq_aux_loss", .batch = 4},
                            MoeCase{.style = "gpt2", .aux = 0.01f, .experts = 8, .topk = 2, .ffn = 16,
                                    .capacity = 1.0, .policy = "position", .pad = true,
                                    .balancing = "seq_aux_loss", .batch = 2},
                            MoeCase{.style = "llama", .aux = 0.01f, .experts = 8, .topk = 4, .ffn = 16,
                                    .scaling = 2.5f, .score = "sigmoid", .groups = 4, .group_topk = 2, .bias = true,
                                    .balancing = "seq_aux_loss", .batch = 3},
                            MoeCase{.style = "llama", .aux = 0.1f, .topk = 1, .score = "sigmoid",
                                    .balancing = "seq_aux_loss", .batch = 6},
                            // the z-loss on the logits with sigmoid scores (Megatron's apply_z_loss)
                            MoeCase{.style = "gpt2", .aux = 0.01f, .z = 0.01f, .experts = 8, .topk = 2, .ffn = 16,
                                    .score = "sigmoid", .groups = 4, .group_topk = 2},
                            MoeCase{.style = "llama", .z = 0.05f, .topk = 1, .score = "sigmoid", .bias = true},
                            MoeCase{.style = "gpt2", .aux = 0.01f, .balancing = "none"},
                            // Megatron's sinkhorn routing (no aux loss): sigmoid at top-1, the softmax above
                            MoeCase{.style = "gpt2", .z = 0.001f, .topk = 1, .balancing = "sinkhorn"},
                            MoeCase{.style = "llama", .experts = 6, .topk = 2, .balancing = "sinkhorn"},
                            MoeCase{.style = "gpt2", .z = 0.01f, .experts = 8, .topk = 3, .ffn = 16,
                                    .balancing = "sinkhorn"},
                            // Qwen-MoE's gated shared expert (Megatron's --moe-shared-expert-gate)
                            MoeCase{.style = "gpt2", .aux = 0.01f, .shared = 40, .shared_gate = true},
                            MoeCase{.style = "llama", .z = 0.01f, .experts = 6, .shared = 20, .capacity = 1.0,
                                    .pad = true, .shared_gate = true},
                            // training noise: the router's input jitter, random logits (Megatron's RandomSTE)
                            MoeCase{.style = "gpt2", .aux = 0.01f, .z = 0.001f, .jitter = 0.1f},
                            MoeCase{.style = "llama", .aux = 0.01f, .shared = 20, .shared_gate = true, .jitter = 0.2f},
                            MoeCase{.style = "llama", .aux = 0.01f, .z = 0.01f, .force = true},
                            MoeCase{.style = "gpt2", .aux = 0.01f, .z = 0.001f, .experts = 8, .topk = 3, .ffn = 16,
                                    .capacity = 1.0, .score = "sigmoid", .jitter = 0.05f, .force = true}}) {
    SCOPED_TRACE(mc.style + (mc.pre_softmax ? " pre-softmax" : "") + " E=" + std::to_string(mc.experts) +
                 " shared=" + std::to_string(mc.shared) + " capacity=" + std::to_string(mc.capacity) + " " +
                 mc.policy + (mc.pad ? " pad" : "") + " scaling=" + std::to_string(mc.scaling) + " " + mc.score +
                 " groups=" + std::to_string(mc.groups) + "/" + std::to_string(mc.group_topk) + " " + mc.balancing +
                 " b=" + std::to_string(mc.batch) + " jitter=" + std::to_string(mc.jitter) +
                 (mc.force ? " random logits" : ""));
    TransformerConfig c = testing::tiny_config(mc.style);
    c.num_moe_experts = mc.experts;
    c.moe_router_topk = mc.topk;
    c.moe_ffn_hidden_size = mc.ffn;
    c.moe_router_pre_softmax = mc.pre_softmax;
    c.moe_aux_loss_coeff = mc.aux;
    c.moe_z_loss_coeff = mc.z;
    c.moe_shared_expert_intermediate_size = mc.shared;
    c.moe_expert_capacity_factor = mc.capacity;
    c.moe_token_drop_policy = mc.policy;
    c.moe_pad_expert_input_to_capacity = mc.pad;
    c.moe_router_topk_scaling_factor = mc.scaling;
    c.moe_router_score_function = mc.score;
    c.moe_router_num_groups = mc.groups;
    c.moe_router_group_topk = mc.group_topk;
    c.moe_router_enable_expert_bias = mc.bias;
    c.moe_router_load_balancing_type = mc.balancing;
    c.moe_shared_expert_gate = mc.shared_gate;
    c.moe_input_jitter_eps = mc.jitter;
    c.moe_router_force_load_balancing = mc.force;
    c.finalize();
    c.validate();
    ParamAndGradBuffer params;
    moe::MoELayer layer(params, params, "mlp", c, testing::single_tp());
    params.finalize(5);
    const bool bias = c.add_bias_linear;
    std::vector<std::string> experts;
    for (int64_t e = 0; e < mc.experts; ++e) experts.push_back("mlp.experts.local_experts." + std::to_string(e) + ".");
    if (mc.shared > 0) experts.push_back("mlp.shared_experts.");
    for (size_t e = 0; e < experts.size() && bias; ++e)  // biases start at zero: make them count
      for (const char* b : {"linear_fc1.bias", "linear_fc2.bias"}) {
        Parameter* p = params.find(experts[e] + b);
        ASSERT_NE(p, nullptr);
        p->data.copy_from(random_tensor(p->data.shape(), 100 + static_cast<uint64_t>(e)));
      }
    if (mc.bias) {  // a bias of the scores' scale, so that it changes some choices
      ASSERT_TRUE(layer.router().has_expert_bias());
      layer.router().expert_bias().copy_from(random_tensor({mc.experts}, 55, nullptr, -0.3, 0.3));
    }
    const int64_t b = mc.batch, s = 12 / b, h = c.hidden_size, n = s * b;
    Tensor x = random_tensor({s, b, h}, 7, nullptr, -2.0, 2.0), dy = random_tensor({s, b, h}, 8);
    moe::MoELayerCtx ctx;
    moe::LossTracker tracker;
    tensor_parallel::RngTracker rng(1234, 0, 0);
    const tensor_parallel::RngTracker rng_before = rng;
    Tensor y = layer.forward(ctx, x, &tracker, /*training=*/true, &rng);
    if (mc.pad) {  // no host read: the rows are the capacity's
      EXPECT_TRUE(ctx.router.tokens_per_expert.empty());
      EXPECT_EQ(ctx.plan.rows, mc.experts * ctx.router.capacity);
    } else {
      int64_t routed = 0;
      for (int64_t t : ctx.router.tokens_per_expert) routed += t;
      EXPECT_EQ(routed, n * mc.topk);  // every route counted (before any capacity drop)
      int64_t kept = 0;
      for (int64_t j = 0; j < mc.experts; ++j) kept += std::min(ctx.router.tokens_per_expert[j], ctx.router.capacity);
      if (mc.capacity > 0 && mc.capacity < 1.0) {
        EXPECT_LT(kept, n * mc.topk);  // some routes dropped
      }
    }
    if (mc.balancing == "sinkhorn") {  // an evaluation forward routes by the plain top-k: other experts here
      moe::MoELayerCtx eval;
      layer.forward(eval, x, nullptr, /*training=*/false);
      const Tensor a = ctx.router.topk.to(Device::CPU), e = eval.router.topk.to(Device::CPU);
      EXPECT_FALSE(std::equal(a.data<int32_t>(), a.data<int32_t>() + a.numel(), e.data<int32_t>()))
          << "sinkhorn chose the plain top-k's experts for every token";
    }
    const moe::LossTracker::Sums sums = tracker.take().at(0);  // the losses over their coefficients, one call
    EXPECT_EQ(sums.calls, 1.0);
    const double aux = sums.load_balancing * mc.aux, z = sums.z * mc.z;
    const float scale = 0.5f;
    Tensor dx = layer.backward(ctx, dy, scale);

    char tmpl[] = "/tmp/mcpp_moe_oracle_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    {
      std::ofstream meta(dir + "/meta.txt");
      meta << n << " " << h << " " << mc.experts << " " << mc.topk << " " << mc.ffn << " " << (c.swiglu ? 1 : 0)
           << " " << (bias ? 1 : 0) << " " << (mc.pre_softmax ? 1 : 0) << " " << mc.aux << " " << mc.z << " "
           << scale << " " << mc.shared << " " << mc.capacity << " " << mc.policy << " " << mc.scaling << " "
           << mc.score << " " << mc.groups << " " << mc.group_topk << " " << (mc.bias ? 1 : 0) << " "
           << mc.balancing << " " << b << " " << (mc.shared_gate ? 1 : 0) << " " << (mc.jitter > 0.0f ? 1 : 0) << " "
           << (mc.force ? 1 : 0) << "\n";
    }
    tensor_parallel::RngTracker draws = rng_before;  // the router's draws again: the jitter, then the logits
    if (mc.jitter > 0.0f) {  // the noise factors
      Tensor ones = Tensor::empty({n, h}), noise = Tensor::empty({n, h});
      ones.fill_(1.0f);
      ops::random_scale(noise, ones, 1.0f - mc.jitter, 1.0f + mc.jitter, draws.draw(n * h, false));
      write_raw(dir + "/jitter.bin", noise);
    }
    if (mc.force) {
      Tensor logits = Tensor::empty({n, mc.experts});
      ops::random_normal(logits, draws.draw(2 * n * mc.experts, false));
      write_raw(dir + "/random_logits.bin", logits);
    }
    EXPECT_EQ(draws.offsets(), rng.offsets());  // nothing else drawn
    if (mc.bias) write_raw(dir + "/expert_bias.bin", layer.router().expert_bias());
    write_raw(dir + "/x.bin", x);
    write_raw(dir + "/dy.bin", dy);
    write_raw(dir + "/y.bin", y);
    write_raw(dir + "/dx.bin", dx);
    Parameter* router = params.find("mlp.router.weight");
    ASSERT_NE(router, nullptr);
    write_raw(dir + "/router.bin", router->data);
    write_raw(dir + "/d_router.bin", router->main_grad);
    for (size_t e = 0; e < experts.size(); ++e) {
      const bool sh = static_cast<int64_t>(e) == mc.experts;  // the shared expert: files sh_<name>.bin
      for (const auto& [file, key] : {std::pair<std::string, std::string>{"fc1_w", "linear_fc1.weight"},
                                      {"fc2_w", "linear_fc2.weight"}, {"fc1_b", "linear_fc1.bias"},
                                      {"fc2_b", "linear_fc2.bias"}}) {
        Parameter* p = params.find(experts[e] + key);
        if (!p) continue;
        const std::string name = sh ? "sh_" + file : file + std::to_string(e);
        write_raw(dir + "/" + name + ".bin", p->data);
        write_raw(dir + "/d_" + name + ".bin", p->main_grad);
      }
    }
    if (mc.shared_gate) {  // the gate weight and its grad
      Parameter* g = params.find("mlp.shared_experts.gate_weight");
      ASSERT_NE(g, nullptr);
      write_raw(dir + "/sh_gate.bin", g->data);
      write_raw(dir + "/d_sh_gate.bin", g->main_grad);
    }
    Tensor losses = Tensor::empty({2});
    losses.data<float>()[0] = static_cast<float>(aux);
    losses.data<float>()[1] = static_cast<float>(z);
    write_raw(dir + "/losses.bin", losses);
    const auto [status, out] =
        mcpp::test::run_oracle_script(std::string(MCPP_SOURCE_DIR) + "/tests/oracle/moe_ref.py", dir);
    EXPECT_EQ(status, 0) << out;
    std::system(("rm -rf " + dir).c_str());
  }
}

// The expert bias (aux-loss-free balancing): only training forwards count routes (an evaluation forward —
// losses == nullptr — does not); the update is Megatron's b += rate * sign(mean - count), the counts then reset;
// update_expert_biases sums the counts over the given groups (a size-1 group here) before updating. Without and with
// the switch loss (whose dropless route counts the bias then shares).
TEST(MoELayer, ExpertBiasCountsTrainingRoutesAndMovesBySign) {
  for (const float aux : {0.0f, 0.01f}) {
    SCOPED_TRACE(::testing::Message() << "aux loss coefficient " << aux);
    TransformerConfig c = testing::tiny_config("gpt2");
    c.moe_aux_loss_coeff = aux;  // with the switch loss the dropless counts come from its statistics
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.moe_router_score_function = "sigmoid";
    c.moe_router_enable_expert_bias = true;
    c.finalize();
    c.validate();
    ParamAndGradBuffer params;
    moe::MoELayer layer(params, params, "mlp", c, testing::single_tp());
    params.finalize(3);
    moe::TopKRouter& router = layer.router();
    ASSERT_TRUE(router.has_expert_bias());
    EXPECT_EQ(router.expert_bias_key(), "mlp.router.expert_bias");
    Tensor x = random_tensor({6, 2, c.hidden_size}, 9);
    moe::MoELayerCtx eval_ctx;
    layer.forward(eval_ctx, x, nullptr);  // evaluation: not counted
    EXPECT_EQ(router.take_route_counts(), std::vector<int64_t>(4, 0));
    moe::LossTracker losses;
    moe::MoELayerCtx ctx;
    layer.forward(ctx, x, &losses);
    layer.forward(ctx, x, &losses);  // two microbatches of the step
    std::vector<int64_t> want = ctx.router.tokens_per_expert;
    for (int64_t& v : want) v *= 2;
    const std::vector<int64_t> counts = router.take_route_counts();
    EXPECT_EQ(counts, want);
    EXPECT_EQ(router.take_route_counts(), std::vector<int64_t>(4, 0));  // taken: reset
    const int64_t sample[4] = {5, 3, 4, 4};  // mean 4: under-used expert 1 up, over-used expert 0 down
    router.update_expert_bias(sample, 0.01f);
    router.update_expert_bias(sample, 0.01f);
    const std::vector<double> b = testing::to_doubles(router.expert_bias());
    EXPECT_FLOAT_EQ(static_cast<float>(b[0]), -0.02f);
    EXPECT_FLOAT_EQ(static_cast<float>(b[1]), 0.02f);
    EXPECT_EQ(b[2], 0.0);
    EXPECT_EQ(b[3], 0.0);
    layer.forward(ctx, x, &losses);  // the counts of a step, through update_expert_biases
    const std::vector<int64_t> step = ctx.router.tokens_per_expert;
    moe::update_expert_biases({&router}, {comm::make_local_world()}, 0.5f);
    const std::vector<double> b2 = testing::to_doubles(router.expert_bias());
    double mean = 0.0;
    for (int64_t v : step) mean += static_cast<double>(v) / 4.0;
    for (size_t j = 0; j < 4; ++j) {
      const double sign = mean > static_cast<double>(step[j]) ? 1.0 : mean < static_cast<double>(step[j]) ? -1.0 : 0.0;
      EXPECT_NEAR(b2[j], b[j] + 0.5 * sign, 1e-6) << j;
    }
    // with a capacity the counts are the routes each expert kept (Megatron's routing map after dropping)
    TransformerConfig cc = c;
    cc.moe_expert_capacity_factor = 0.5;
    cc.validate();
    ParamAndGradBuffer cparams;
    moe::MoELayer capped(cparams, cparams, "mlp", cc, testing::single_tp());
    cparams.finalize(3);
    moe::MoELayerCtx cctx;
    capped.forward(cctx, x, &losses);
    const std::vector<int64_t> kept = capped.router().take_route_counts();
    EXPECT_EQ(kept, cctx.router.rows_per_expert);
    int64_t sum_kept = 0, sum_routed = 0;
    for (size_t j = 0; j < 4; ++j) sum_kept += kept[j], sum_routed += cctx.router.tokens_per_expert[j];
    EXPECT_LT(sum_kept, sum_routed);  // some routes dropped, and not counted
  }
}

// An expert that no token chose does no work, and its gradients are still written (zero) and reported ready —
// with the trainer's overwrite mode (stale main grads) and when accumulating.
TEST(MoELayer, UnchosenExpertsGetZeroGradients) {
  TransformerConfig c = testing::tiny_config("llama");
  c.num_moe_experts = 64;  // 12 tokens x top-1 cannot reach them all
  c.moe_router_topk = 1;
  c.finalize();
  c.validate();
  ParamAndGradBuffer params;
  params.set_overwrite_main_grad(true);
  moe::MoELayer layer(params, params, "mlp", c, testing::single_tp());
  params.finalize(3);
  params.grad_buffer().fill_(7.0f);  // a previous step's values
  int64_t ready = 0;
  params.set_grad_ready_hook([&](Parameter&) { ++ready; });
  params.zero_grad();
  moe::MoELayerCtx ctx;
  Tensor x = random_tensor({6, 2, c.hidden_size}, 9);
  layer.forward(ctx, x, nullptr);
  std::vector<int64_t> tokens = ctx.router.tokens_per_expert;
  layer.backward(ctx, random_tensor({6, 2, c.hidden_size}, 10), 1.0f);
  EXPECT_EQ(ready, static_cast<int64_t>(params.params().size()));  // every parameter reported once
  int64_t idle = 0;
  for (int64_t e = 0; e < 64; ++e) {
    if (tokens[static_cast<size_t>(e)] > 0) continue;
    ++idle;
    Parameter* w = params.find("mlp.experts.local_experts." + std::to_string(e) + ".linear_fc1.weight");
    ASSERT_NE(w, nullptr);
    EXPECT_FALSE(w->grad_stale);
    EXPECT_EQ(ops::sum_of_squares(w->main_grad), 0.0);
  }
  EXPECT_GT(idle, 0);
}

}  // namespace
}  // namespace mcpp
