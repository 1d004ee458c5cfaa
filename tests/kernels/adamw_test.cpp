// ops::cpu::adamw_step against torch.optim.AdamW (tests/oracle/adamw_ref.py under /usr/bin/python3, the
// Debian python with torch — MCPP_PY in tests/CMakeLists.txt), three steps on fixed data, plus the bf16 /
// fp32 model-copy output and argument checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

TEST(CpuAdamW, ThreeStepsMatchTorchAdamW) {
  const int64_t n = 1000, steps = 3;
  const ops::AdamWOptions base{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  std::vector<double> p0 = random_vec(n, 1, -1.0, 1.0);
  std::vector<std::vector<double>> grads;
  for (int64_t s = 0; s < steps; ++s) {
    grads.push_back(random_vec(n, 10 + s, -1.0, 1.0));
    for (int64_t i = 0; i < n; i += 97) grads.back()[i] = 0.0;   // zero grads: the eps path
    for (int64_t i = 5; i < n; i += 89) grads.back()[i] *= 1e3;  // large grads
  }
  // Inputs for the oracle, in exactly the fp32 values the kernel sees.
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_adamw_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto in_path = dir / "in.f32", out_path = dir / "out.f32";
  {
    std::ofstream f(in_path, std::ios::binary);
    auto put = [&](const std::vector<double>& v) {
      for (double d : v) {
        float x = static_cast<float>(d);
        f.write(reinterpret_cast<const char*>(&x), 4);
      }
    };
    put(p0);
    for (auto& g : grads) put(g);
  }
  const std::string cmd =
      fmt::format("{}{}/tests/oracle/adamw_ref.py {} {} {} {} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} 2>&1",
                  mcpp::test::oracle_python(), MCPP_SOURCE_DIR, in_path.string(), out_path.string(), n, steps, base.lr,
                  base.beta1, base.beta2, base.eps, base.weight_decay);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string log;
  char buf[256];
  while (std::fgets(buf, sizeof buf, pipe)) log += buf;
  ASSERT_EQ(::pclose(pipe), 0) << cmd << "\n" << log;
  std::vector<float> ref(static_cast<size_t>(steps * 3 * n));
  {
    std::ifstream f(out_path, std::ios::binary);
    f.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
    ASSERT_EQ(f.gcount(), static_cast<std::streamsize>(ref.size() * 4)) << "short oracle output " << out_path;
  }
  std::filesystem::remove_all(dir);

  Tensor param = from_doubles(p0, {n}), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  Tensor model = Tensor::empty({n}, DType::BF16);
  for (int64_t s = 0; s < steps; ++s) {
    ops::AdamWOptions opt = base;
    opt.step = s + 1;
    Tensor g = from_doubles(grads[s], {n});
    cpu::adamw_step(param, m, v, g, &model, opt, {});
    auto slice = [&](int k) {
      const float* p = ref.data() + (s * 3 + k) * n;
      return std::vector<double>(p, p + n);
    };
    // Same fp32 operation order as torch's single-tensor AdamW; torch may fuse/vectorise differently,
    // so allow a few ulps: 1e-6 relative (floor 1e-6 for the near-zero moments of zero grads).
    // Same fp32 operation order as torch's single-tensor AdamW, but torch's vectorised kernels may fuse
    // multiply-adds, so results differ by an ulp or two of the operands. Near-cancelling elements (m or
    // param close to 0) make relative errors meaningless, so measure the error in ulps of the vector's
    // largest magnitude (2^-23 * max|ref|) and allow 4 — a wrong formula (missing bias correction, eps
    // in the wrong place, decay after the update) is off by many thousands.
    for (int k = 0; k < 3; ++k) {
      const Tensor& got = k == 0 ? param : k == 1 ? m : v;
      const std::vector<double> want = slice(k);
      double scale = 0.0;
      for (double w : want) scale = std::max(scale, std::abs(w));
      const double ulps = max_abs_error(to_doubles(got), want) / (scale * 0x1.0p-23);
      EXPECT_LE(ulps, 4.0) << (k == 0 ? "param" : k == 1 ? "exp_avg" : "exp_avg_sq") << ", step " << s + 1;
    }
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(model.data<uint16_t>()[i], f32_to_bf16(param.data<float>()[i])) << "bf16 model copy at " << i;
  }
}

TEST(CpuAdamW, Fp32ModelCopyAndArgumentChecks) {
  Tensor p = random_tensor({8}, 1), m = Tensor::zeros({8}), v = Tensor::zeros({8}), g = random_tensor({8}, 2);
  Tensor model = Tensor::empty({8});
  cpu::adamw_step(p, m, v, g, &model, ops::AdamWOptions{}, {});
  EXPECT_EQ(to_doubles(model), to_doubles(p));
  Tensor short_g = Tensor::zeros({7});
  try {
    cpu::adamw_step(p, m, v, short_g, nullptr, ops::AdamWOptions{}, {});
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adamw_step: grad must have 8 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu::adamw_step(p, m, v, g, nullptr, ops::AdamWOptions{.step = 0}, {}), Error);
  EXPECT_THROW(cpu::adamw_step(p, m, v, g, nullptr, ops::AdamWOptions{.beta2 = 1.0f}, {}), Error);
  Tensor int_model = Tensor::zeros({8}, DType::I32);
  EXPECT_THROW(cpu::adamw_step(p, m, v, g, &int_model, ops::AdamWOptions{}, {}), Error);
}

TEST(CpuAdamW, MultiStepIsBitIdenticalToPerTensorSteps) {
  // Entries of different sizes, weight decays and model copies (bf16 / f32 / none); two steps.
  const std::vector<int64_t> sizes{1, 7, 8, 1000, 4099};
  std::vector<ops::AdamWTensors> list;
  std::vector<Tensor> p_ref, m_ref, v_ref, model_ref;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    Tensor p = random_tensor({n}, 100 + k);
    const DType md = k % 3 == 0 ? DType::BF16 : DType::F32;
    Tensor model = k % 3 == 2 ? Tensor() : Tensor::zeros({n}, md);
    p_ref.push_back(p.clone());
    m_ref.push_back(Tensor::zeros({n}));
    v_ref.push_back(Tensor::zeros({n}));
    model_ref.push_back(model.defined() ? Tensor::zeros({n}, md) : Tensor());
    list.push_back(ops::AdamWTensors{.param = p, .exp_avg = Tensor::zeros({n}), .exp_avg_sq = Tensor::zeros({n}),
                                     .grad = Tensor::zeros({n}), .param_model = model,
                                     .weight_decay = k % 2 ? 0.0f : 0.1f});
  }
  for (int64_t step = 1; step <= 2; ++step) {
    const ops::AdamWOptions opt{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.5f,
                                .step = step};
    for (size_t k = 0; k < list.size(); ++k) {
      Tensor g = random_tensor({sizes[k]}, 200 + 10 * static_cast<uint64_t>(step) + k);
      std::memcpy(list[k].grad.raw(), g.raw(), g.nbytes());
      ops::AdamWOptions o = opt;
      o.weight_decay = list[k].weight_decay;  // the entry's decay replaces opt.weight_decay (0.5 unused)
      cpu::adamw_step(p_ref[k], m_ref[k], v_ref[k], g, model_ref[k].defined() ? &model_ref[k] : nullptr, o, {});
    }
    ops::adamw_multi_step(list, opt);  // dispatching API: CPU tensors -> cpu backend
  }
  for (size_t k = 0; k < list.size(); ++k) {
    SCOPED_TRACE(k);
    EXPECT_EQ(std::memcmp(list[k].param.raw(), p_ref[k].raw(), p_ref[k].nbytes()), 0);
    EXPECT_EQ(std::memcmp(list[k].exp_avg.raw(), m_ref[k].raw(), m_ref[k].nbytes()), 0);
    EXPECT_EQ(std::memcmp(list[k].exp_avg_sq.raw(), v_ref[k].raw(), v_ref[k].nbytes()), 0);
    if (model_ref[k].defined()) {
      EXPECT_EQ(std::memcmp(list[k].param_model.raw(), model_ref[k].raw(), model_ref[k].nbytes()), 0);
    }
  }
  // argument checks name the op's field, as adamw_step's
  list[1].grad = Tensor::zeros({3});
  EXPECT_THROW(ops::adamw_multi_step(list, ops::AdamWOptions{}), Error);
  ops::adamw_multi_step({}, ops::AdamWOptions{});  // empty list: no-op
}

}  // namespace
}  // namespace mcpp
