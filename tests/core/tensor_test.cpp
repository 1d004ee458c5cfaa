#include "mcpp/core/tensor.h"

#include <gtest/gtest.h>

#include "mcpp/core/error.h"
#include "mcpp/core/rng.h"

namespace mcpp {

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 3});
  Tensor rows = t.narrow0(1, 2);
  rows.fill_(2.0f);
  EXPECT_EQ(t.data<float>()[2], 0.0f);
  EXPECT_EQ(t.data<float>()[3], 2.0f);
  EXPECT_EQ(t.data<float>()[8], 2.0f);
  EXPECT_EQ(t.data<float>()[9], 0.0f);
  Tensor v = t.view({-1});
  EXPECT_EQ(v.numel(), 12);
  EXPECT_TRUE(v.same_storage(t));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(t.narrow0(3, 2), Error);
  EXPECT_THROW(t.data<int32_t>(), Error);
}

TEST(Tensor, DtypeRoundTrip) {
  Tensor t = Tensor::empty({5});
  float vals[5] = {1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f};
  for (int i = 0; i < 5; ++i) t.data<float>()[i] = vals[i];
  Tensor b = t.to(DType::BF16).to(DType::F32);
  Tensor h = t.to(DType::F16).to(DType::F32);
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(b.data<float>()[i], vals[i], std::abs(vals[i]) * 1.0 / 128);   // bf16: 8 mantissa bits
    EXPECT_NEAR(h.data<float>()[i], vals[i], std::abs(vals[i]) * 1.0 / 1024);  // fp16: 11 bits
  }
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
}

TEST(Rng, PhiloxKnownAnswer) {
  // Known-answer vector from the Random123 distribution (kat_vectors: philox4x32_10, all-zero inputs).
  auto r = philox4x32_10(0, 0, 0);
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
}

}  // namespace mcpp
