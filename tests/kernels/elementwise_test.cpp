// ops::cpu::add / add_inplace / scale_inplace / cast against float64 references and core/dtype.h.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"

namespace mcpp {
namespace {
using namespace mcpp::testing;
namespace cpu = mcpp::ops::cpu;

TEST(CpuElementwise, AddAddInplaceScale) {
  for (int64_t n : {13, 100000}) {  // 100000 takes the OpenMP path
    std::vector<double> a, b;
    Tensor ta = random_tensor({n}, 1, &a), tb = random_tensor({n}, 2, &b);
    Tensor out = Tensor::empty({n});
    cpu::add(out, ta, tb, {});
    std::vector<double> sum(a.size()), twice(a.size());
    for (size_t i = 0; i < a.size(); ++i) sum[i] = static_cast<float>(a[i] + b[i]);  // one fp32 rounding
    EXPECT_EQ(to_doubles(out), sum);  // IEEE addition is exactly the rounded double sum here
    cpu::add_inplace(ta, tb, {});
    EXPECT_EQ(to_doubles(ta), sum);
    cpu::scale_inplace(ta, 0.5f, {});  // power of two: exact
    for (size_t i = 0; i < a.size(); ++i) twice[i] = sum[i] * 0.5;
    EXPECT_EQ(to_doubles(ta), twice);
  }
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({5}), out = Tensor::zeros({6});
  EXPECT_NO_THROW(cpu::add(out, a, a, {}));  // shapes compared by numel
  try {
    cpu::add(out, a, b, {});
    FAIL() << "expected mcpp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add: b must have 6 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu::add_inplace(out, b, {}), Error);
}

TEST(CpuElementwise, CastRoundTripsAndMatchesDtypeConversions) {
  const float vals[] = {1.0f, -2.5f, 3.14159265f, 1e-3f, 65504.0f, 1e-40f, INFINITY, -0.0f, 1.0f + 0x1.0p-8f};
  const int64_t n = sizeof(vals) / sizeof(vals[0]);
  Tensor f = Tensor::empty({n});
  for (int64_t i = 0; i < n; ++i) f.data<float>()[i] = vals[i];
  Tensor bf = Tensor::empty({n}, DType::BF16), hf = Tensor::empty({n}, DType::F16), back = Tensor::empty({n});
  cpu::cast(bf, f, {});
  cpu::cast(hf, f, {});
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(bf.data<uint16_t>()[i], f32_to_bf16(vals[i])) << i;  // same rounding as core/dtype.h
    EXPECT_EQ(hf.data<uint16_t>()[i], f32_to_f16(vals[i])) << i;
  }
  EXPECT_EQ(bf.data<uint16_t>()[0], 0x3f80);  // 1.0 in bf16
  EXPECT_EQ(bf.data<uint16_t>()[8], 0x3f80);  // 1 + 2^-8 is a tie: rounds to even (1.0)
  cpu::cast(back, bf, {});
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(back.data<float>()[i], bf16_to_f32(f32_to_bf16(vals[i]))) << i;
  Tensor hb = Tensor::empty({n}, DType::BF16);
  cpu::cast(hb, hf, {});  // f16 -> bf16 goes through fp32
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hb.data<uint16_t>()[i], f32_to_bf16(f16_to_f32(hf.data<uint16_t>()[i])));
  Tensor same = Tensor::empty({n});
  cpu::cast(same, f, {});
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(std::memcmp(&same.data<float>()[i], &vals[i], 4), 0);
  Tensor ints = Tensor::zeros({n}, DType::I32), short_out = Tensor::empty({n - 1});
  EXPECT_THROW(cpu::cast(ints, f, {}), Error);
  EXPECT_THROW(cpu::cast(short_out, f, {}), Error);
}

}  // namespace
}  // namespace mcpp
