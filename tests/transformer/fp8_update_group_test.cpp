// The FP8 update group (tensor_parallel/fp8_state.h Fp8UpdateGroup) on the CPU backend: an MLP whose delayed-scaling
// updates run together at the end of each pass gives bit for bit the outputs, input gradients, main grads and FP8
// state (every scale and amax history) of the same MLP whose linears update right after their GEMMs — over three
// rounds of two microbatches (forward, forward, backward, backward), with a four-entry max history so the history
// matters; the backward reads the forward's scales from the group's per-pass copies. Misuse gets named errors: joining
// after the first pass, a linear run twice in one pass — also what a model that forgot a pass's flush runs into; a
// pass that stopped on an error is dropped by the next one's begin (BeginDropsAnAbortedPass).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/distributed/param_and_grad_buffer.h"
#include "mcpp/tensor_parallel/fp8_state.h"
#include "mcpp/transformer/mlp.h"
#include "models/gpt_test_util.h"

namespace mcpp {
namespace {
using mcpp::testing::random_tensor;
using Pass = tensor_parallel::Fp8UpdateGroup::Pass;

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TransformerConfig fp8_config() {
  TransformerConfig c = testing::tiny_config("gpt2");  // h 32, f 128, biases, GELU (in the casts under delayed)
  c.fp8_format = "hybrid";
  c.fp8_recipe = "delayed";
  c.fp8_amax_history_len = 4;
  c.fp8_amax_compute_algo = "max";
  c.validate();
  return c;
}

struct Mlp {
  ParamAndGradBuffer params;
  std::unique_ptr<MLP> mlp;
  std::shared_ptr<tensor_parallel::Fp8UpdateGroup> group;  // null: the per-linear updates
  Mlp(const TransformerConfig& c, bool grouped) {
    const tensor_parallel::TPContext tp = testing::single_tp();
    tensor_parallel::Fp8Options fp8 = c.fp8_options();
    if (grouped) fp8.updates = group = std::make_shared<tensor_parallel::Fp8UpdateGroup>(tp.group);
    mlp = std::make_unique<MLP>(params, "mlp", c, tp, fp8);
    params.finalize(13);
    params.find("mlp.linear_fc1.bias")->data.copy_from(random_tensor({c.ffn_hidden_size}, 1));
    params.find("mlp.linear_fc2.bias")->data.copy_from(random_tensor({c.hidden_size}, 2));
  }
  void flush(Pass p) const {
    if (group) group->flush(p);
  }
};

TEST(Fp8UpdateGroup, IsBitwiseThePerLinearUpdates) {
  const TransformerConfig c = fp8_config();
  Mlp alone(c, false), grouped(c, true);
  ASSERT_TRUE(grouped.mlp->fp8_act_in_casts());
  const int64_t s = 6, b = 2, h = c.hidden_size;
  for (uint64_t round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    std::vector<Tensor> xs, dys;
    for (uint64_t m = 0; m < 2; ++m) {  // magnitudes that change per microbatch: the scales move
      const double r = 0.5 + static_cast<double>(2 * round + m);
      xs.push_back(random_tensor({s, b, h}, 10 * round + m, nullptr, -r, r));
      dys.push_back(random_tensor({s, b, h}, 20 * round + m, nullptr, -r / 8, r / 8));
    }
    std::vector<MLPCtx> ca(2), cg(2);
    for (size_t m = 0; m < 2; ++m) {
      const Tensor ya = alone.mlp->forward(ca[m], xs[m]);
      const Tensor yg = grouped.mlp->forward(cg[m], xs[m]);
      grouped.flush(Pass::Forward);
      EXPECT_TRUE(bitwise_equal(ya, yg)) << "y of microbatch " << m;
    }
    for (size_t m = 0; m < 2; ++m) {
      const Tensor da = alone.mlp->backward(ca[m], dys[m]);
      const Tensor dg = grouped.mlp->backward(cg[m], dys[m]);
      grouped.flush(Pass::Backward);
      EXPECT_TRUE(bitwise_equal(da, dg)) << "dx of microbatch " << m;
    }
  }
  for (const char* key : {"mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight",
                          "mlp.linear_fc2.bias"})
    EXPECT_TRUE(bitwise_equal(alone.params.find(key)->main_grad, grouped.params.find(key)->main_grad)) << key;
  const auto& sa = alone.params.rank_states();
  const auto& sg = grouped.params.rank_states();
  ASSERT_EQ(sa.size(), 12u);  // 2 linears x {input, weight, grad_output} x {scale, amax_history}
  ASSERT_EQ(sg.size(), sa.size());
  bool moved = false;
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].first, sg[i].first);
    EXPECT_TRUE(bitwise_equal(*sa[i].second, *sg[i].second)) << sa[i].first;
    if (sa[i].first.ends_with(".scale")) moved |= sa[i].second->data<float>()[0] != 1.0f;
  }
  EXPECT_TRUE(moved) << "no scale moved: the comparison would be vacuous";
}

TEST(Fp8UpdateGroup, MisuseIsANamedError) {
  const TransformerConfig c = fp8_config();
  Mlp grouped(c, true);
  MLPCtx ctx;
  const Tensor x = random_tensor({4, 2, c.hidden_size}, 3);
  grouped.mlp->forward(ctx, x);
  tensor_parallel::Fp8TensorMeta late;
  EXPECT_THROW(
      {
        try {
          grouped.group->add(Pass::Forward, &late, {});
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("after the group's first pass"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  MLPCtx again;
  auto expect_twice = [](const std::function<void()>& f) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("twice in one pass"), std::string::npos) << e.what();
    }
  };
  expect_twice([&] { grouped.mlp->forward(again, x); });  // the same linears again, no flush between
  Mlp unflushed(c, true);  // forwards flushed, the backward pass not: the next backward finds its slots taken
  std::vector<MLPCtx> cu(2);
  for (MLPCtx& cx : cu) {
    unflushed.mlp->forward(cx, x);
    unflushed.flush(Pass::Forward);
  }
  const Tensor dy = random_tensor({4, 2, c.hidden_size}, 4);
  unflushed.mlp->backward(cu[0], dy);
  expect_twice([&] { unflushed.mlp->backward(cu[1], dy); });
}

// A pass that stopped on an error (recorded, never flushed) leaves no trace once the next pass begins: the states
// after begin + a flushed pass equal those of the flushed pass alone (GPTModel begins every forward and backward).
TEST(Fp8UpdateGroup, BeginDropsAnAbortedPass) {
  const TransformerConfig c = fp8_config();
  Mlp aborted(c, true), clean(c, true);
  const Tensor big = random_tensor({4, 2, c.hidden_size}, 7, nullptr, -50.0, 50.0);
  const Tensor x = random_tensor({4, 2, c.hidden_size}, 8);
  MLPCtx c0, c1, c2;
  aborted.mlp->forward(c0, big);  // its amaxes recorded; no flush (as if the pass had thrown)
  aborted.group->begin(Pass::Forward);
  aborted.mlp->forward(c1, x);
  aborted.flush(Pass::Forward);
  clean.group->begin(Pass::Forward);  // nothing recorded: nothing runs
  clean.mlp->forward(c2, x);
  clean.flush(Pass::Forward);
  const auto& sa = aborted.params.rank_states();
  const auto& sc = clean.params.rank_states();
  ASSERT_EQ(sa.size(), sc.size());
  bool moved = false;
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(*sa[i].second, *sc[i].second)) << sa[i].first;
    if (sa[i].first.ends_with("input.scale")) moved |= sa[i].second->data<float>()[0] != 1.0f;
  }
  EXPECT_TRUE(moved);
}

}  // namespace
}  // namespace mcpp
