// CUDA fused residual add + norm (add_layernorm_fwd / add_rmsnorm_fwd, add_layernorm_bwd / add_rmsnorm_bwd):
//   forward vs the CUDA unfused ops (add, then layernorm_fwd / rmsnorm_fwd): bitwise (sum, y, mean, rstd);
//   forward vs the CPU backend: sum bitwise (a + b in fp32, one rounding to the dtype), y to tolerance;
//   backward vs the CPU fused op to tolerance; float32 dx bitwise equal to the CUDA norm bwd + add_inplace
//   (bf16 dx: one rounding instead of two, compared to tolerance); dgamma/dbeta bit-identical reruns;
//   the residual bias sums (column sums of dres and of dx as stored) against float64 sums; the residual
//   dropout (bias-dropout-add) against dropout_fwd / dropout_bwd around the op without it, bitwise.
// Shapes cover the vector paths (1..8 warps per row, 1..4 chunks per thread in the backward — h = 2048,
// 4096, 4104, 8192 —, several rows per block, rows not a multiple of the block's rows, many rows per
// persistent block) and the scalar path (h % 8 != 0, h > 8192).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/cuda_test_util.h"

namespace mcpp {
namespace {
using namespace cuda_test;

struct Case {
  int64_t n, h;
};
const Case kCases[] = {{37, 1000}, {29, 768},  {13, 2048}, {7, 4096},  {5, 4104},
                       {3, 8192},  {4, 8200}, {3000, 64}, {1001, 768}, {2001, 128}};

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::CPU), y = b.to(Device::CPU);
  return x.nbytes() == y.nbytes() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

enum Kind { kLayerNormBeta = 0, kLayerNorm = 1, kRmsNorm = 2 };

TEST(CudaAddNorm, ForwardEqualsUnfusedBitwiseAndMatchesCpu) {
  MCPP_REQUIRE_CUDA();
  for (const Case& c : kCases) {
    for (DType dt : float_dtypes()) {
      for (int kind : {kLayerNormBeta, kLayerNorm, kRmsNorm}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << c.n << " h=" << c.h << " kind=" << kind);
        const int64_t n = c.n, h = c.h;
        const float eps = kind == kRmsNorm ? 1e-6f : 1e-5f;
        const Tensor a = rnd({n, h}, 1, dt, -2, 3), b = rnd({n, h}, 2, dt), g = rnd({h}, 3), beta = rnd({h}, 4);
        const Tensor ad = dev(a, dt), bd = dev(b, dt), gd = dev(g), betad = dev(beta);
        const Tensor* pb = kind == kLayerNormBeta ? &betad : nullptr;
        // unfused on CUDA
        Tensor sum_u = poisoned({n, h}, dt), y_u = poisoned({n, h}, dt);
        Tensor mean_u = poisoned({n}, DType::F32), rstd_u = poisoned({n}, DType::F32);
        ops::add(sum_u, ad, bd);
        if (kind == kRmsNorm) ops::rmsnorm_fwd(y_u, rstd_u, sum_u, gd, eps);
        else ops::layernorm_fwd(y_u, mean_u, rstd_u, sum_u, gd, pb, eps);
        // fused on CUDA
        Tensor sum = poisoned({n, h}, dt), y = poisoned({n, h}, dt);
        Tensor mean = poisoned({n}, DType::F32), rstd = poisoned({n}, DType::F32);
        if (kind == kRmsNorm) ops::add_rmsnorm_fwd(sum, y, rstd, ad, bd, gd, eps, {});
        else ops::add_layernorm_fwd(sum, y, mean, rstd, ad, bd, gd, pb, eps, {});
        EXPECT_TRUE(same_bits(sum, sum_u)) << "sum";
        EXPECT_TRUE(same_bits(y, y_u)) << "y";
        EXPECT_TRUE(same_bits(rstd, rstd_u)) << "rstd";
        if (kind != kRmsNorm) {
          EXPECT_TRUE(same_bits(mean, mean_u)) << "mean";
        }
        // vs the CPU: sum = a + b in fp32 rounded once to dt; the norm of that rounded sum
        Tensor sum_ref = Tensor::empty({n, h});
        ops::cpu::add(sum_ref, a, b, {});
        sum_ref = sum_ref.to(dt).to(DType::F32);
        EXPECT_TRUE(same_bits(host(sum), sum_ref)) << "sum vs CPU";
        Tensor y_ref = Tensor::empty({n, h}), mean_ref = Tensor::empty({n}), rstd_ref = Tensor::empty({n});
        if (kind == kRmsNorm) ops::cpu::rmsnorm_fwd(y_ref, rstd_ref, sum_ref, g, eps, {});
        else ops::cpu::layernorm_fwd(y_ref, mean_ref, rstd_ref, sum_ref, g, kind == kLayerNormBeta ? &beta : nullptr,
                                     eps, {});
        EXPECT_REL(host(y), y_ref, tol(dt, 1e-5));
        EXPECT_REL(host(rstd), rstd_ref, 1e-5);
        if (kind != kRmsNorm) EXPECT_REL(host(mean), mean_ref, 1e-5);
      }
    }
  }
}

TEST(CudaAddNorm, BackwardMatchesCpuAndUnfused) {
  MCPP_REQUIRE_CUDA();
  for (const Case& c : kCases) {
    for (DType dt : float_dtypes()) {
      for (int kind : {kLayerNormBeta, kLayerNorm, kRmsNorm}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << c.n << " h=" << c.h << " kind=" << kind);
        const int64_t n = c.n, h = c.h;
        const bool rms = kind == kRmsNorm, with_beta = kind == kLayerNormBeta;
        const Tensor x = rnd({n, h}, 5, dt, -2, 3), g = rnd({h}, 6), dy = rnd({n, h}, 7, dt), dres = rnd({n, h}, 8, dt);
        Tensor y = Tensor::empty({n, h}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
        if (rms) ops::cpu::rmsnorm_fwd(y, rstd, x, g, 1e-6f, {});
        else ops::cpu::layernorm_fwd(y, mean, rstd, x, g, nullptr, 1e-5f, {});
        const Tensor xd = dev(x, dt), gd = dev(g), dyd = dev(dy, dt), dresd = dev(dres, dt);
        const Tensor meand = dev(mean), rstdd = dev(rstd);
        // CPU reference (the fused CPU op = the unfused composition; tests/kernels/add_norm_test.cpp)
        Tensor dx_ref = Tensor::empty({n, h}), dg_ref = rnd({h}, 9), db_ref = rnd({h}, 10);
        Tensor dg = dev(dg_ref), db = dev(db_ref);  // prior contents: must accumulate
        auto run = [&](Tensor& dx, Tensor& dgt, Tensor& dbt, const Tensor* res) {
          if (rms) {
            if (res) ops::add_rmsnorm_bwd(dx, dgt, dyd, *res, xd, gd, rstdd, nullptr, nullptr, {}, nullptr);
            else ops::rmsnorm_bwd(dx, dgt, dyd, xd, gd, rstdd);
          } else {
            if (res)
              ops::add_layernorm_bwd(dx, dgt, with_beta ? &dbt : nullptr, dyd, *res, xd, gd, meand, rstdd, nullptr,
                                     nullptr, {}, nullptr);
            else ops::layernorm_bwd(dx, dgt, with_beta ? &dbt : nullptr, dyd, xd, gd, meand, rstdd);
          }
        };
        if (rms) ops::cpu::add_rmsnorm_bwd(dx_ref, dg_ref, dy, dres, x, g, rstd, nullptr, nullptr, {}, nullptr, {});
        else
          ops::cpu::add_layernorm_bwd(dx_ref, dg_ref, with_beta ? &db_ref : nullptr, dy, dres, x, g, mean, rstd,
                                      nullptr, nullptr, {}, nullptr, {});
        Tensor dx = poisoned({n, h}, dt);
        run(dx, dg, db, &dresd);
        EXPECT_REL(host(dx), dx_ref, tol(dt, 1e-5));
        EXPECT_REL(host(dg), dg_ref, 1e-5);
        if (with_beta) EXPECT_REL(host(db), db_ref, 1e-5);
        // unfused on CUDA: the norm's bwd, then add_inplace
        Tensor dx_u = poisoned({n, h}, dt), dg_u = Tensor::zeros({h}, DType::F32, Device::CUDA);
        Tensor db_u = Tensor::zeros({h}, DType::F32, Device::CUDA);
        run(dx_u, dg_u, db_u, nullptr);
        ops::add_inplace(dx_u, dresd);
        if (dt == DType::F32) {
          EXPECT_TRUE(same_bits(dx, dx_u)) << "fp32 dx vs bwd + add_inplace";
        } else {
          EXPECT_REL(host(dx), host(dx_u), 1e-2);
        }
        // reruns: bit-identical dx and (vector path) dgamma / dbeta
        Tensor dx2 = poisoned({n, h}, dt), dg2 = dev(rnd({h}, 9)), db2 = dev(rnd({h}, 10));
        run(dx2, dg2, db2, &dresd);
        EXPECT_TRUE(same_bits(dx, dx2)) << "dx differs between identical runs";
        if (h % 8 == 0 && h <= 8192) {
          EXPECT_TRUE(same_bits(dg, dg2)) << "dgamma differs between identical runs";
          if (with_beta) {
            EXPECT_TRUE(same_bits(db, db2)) << "dbeta differs between identical runs";
          }
        }
      }
    }
  }
}

// The residual bias sums (dres_sum_acc / dx_sum_acc): the column sums of dres and of dx as stored (bf16:
// after its rounding), accumulated onto prior contents — against float64 sums of those very tensors read
// back; the same dx, dgamma, dbeta as the call without sums; bit-identical reruns. Vector path (in the
// norm kernel) and scalar path (the column-sum kernel after it) alike.
TEST(CudaAddNorm, ResidualBiasSumsAreColumnSumsOfDresAndDx) {
  MCPP_REQUIRE_CUDA();
  for (const Case& c : kCases) {
    for (DType dt : float_dtypes()) {
      for (int kind : {kLayerNormBeta, kRmsNorm}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << c.n << " h=" << c.h << " kind=" << kind);
        const int64_t n = c.n, h = c.h;
        const bool rms = kind == kRmsNorm;
        const Tensor x = rnd({n, h}, 15, dt, -2, 3), g = rnd({h}, 16);
        const Tensor dy = rnd({n, h}, 17, dt), dres = rnd({n, h}, 18, dt);
        Tensor y = Tensor::empty({n, h}), mean = Tensor::empty({n}), rstd = Tensor::empty({n});
        if (rms) ops::cpu::rmsnorm_fwd(y, rstd, x, g, 1e-6f, {});
        else ops::cpu::layernorm_fwd(y, mean, rstd, x, g, nullptr, 1e-5f, {});
        const Tensor xd = dev(x, dt), gd = dev(g), dyd = dev(dy, dt), dresd = dev(dres, dt);
        const Tensor meand = dev(mean), rstdd = dev(rstd);
        const Tensor prior_r = rnd({h}, 19), prior_d = rnd({h}, 20);
        struct Out {
          Tensor dx, dg, db, sr, sd;
        };
        auto run = [&](bool sums) {
          Out o{poisoned({n, h}, dt), Tensor::zeros({h}, DType::F32, Device::CUDA),
                Tensor::zeros({h}, DType::F32, Device::CUDA), dev(prior_r), dev(prior_d)};
          Tensor* sr = sums ? &o.sr : nullptr;
          Tensor* sd = sums ? &o.sd : nullptr;
          if (rms) ops::add_rmsnorm_bwd(o.dx, o.dg, dyd, dresd, xd, gd, rstdd, sr, sd, {}, nullptr);
          else ops::add_layernorm_bwd(o.dx, o.dg, &o.db, dyd, dresd, xd, gd, meand, rstdd, sr, sd, {}, nullptr);
          return o;
        };
        const Out a = run(true), b = run(true), plain = run(false);
        EXPECT_TRUE(same_bits(a.dx, plain.dx)) << "dx with sums vs without";
        EXPECT_REL(host(a.dg), host(plain.dg), 1e-5);
        if (!rms) EXPECT_REL(host(a.db), host(plain.db), 1e-5);
        EXPECT_TRUE(same_bits(a.sr, b.sr)) << "dres sum differs between identical runs";
        EXPECT_TRUE(same_bits(a.sd, b.sd)) << "dx sum differs between identical runs";
        const Tensor dxh = host(a.dx), dresh = host(dresd), srh = host(a.sr), sdh = host(a.sd);
        double worst = 0;
        for (int64_t j = 0; j < h; ++j) {  // float64 sums of the tensors as stored
          double r = prior_r.data<float>()[j], d = prior_d.data<float>()[j];
          for (int64_t i = 0; i < n; ++i) r += dresh.data<float>()[i * h + j], d += dxh.data<float>()[i * h + j];
          worst = std::max({worst, std::abs(srh.data<float>()[j] - r) / (1 + std::abs(r)),
                            std::abs(sdh.data<float>()[j] - d) / (1 + std::abs(d))});
        }
        EXPECT_LT(worst, 1e-5);
      }
    }
  }
}

// Residual dropout (Megatron's bias-dropout-add inside the norm): the fused forward with a dropout on b
// equals dropout_fwd(b), then the op without dropout — bitwise (sum, y, mean, rstd), b unwritten; the
// backward's dx, dgamma, dbeta and dres sum equal the op's without dropout bitwise (the same reduction
// partition: recompute and pipeline layouts, which run the dropout apart, stay bitwise equal to the plain
// run) and dbranch equals dropout_bwd of that dx bitwise; the branch sum (dx_sum_acc) is the column sum of
// dbranch as stored (float64 of the tensor read back). A CUDA-graph key (device base) draws the
// absolute offset's mask. Vector paths (fp32, bf16; 1..8 warps a row, several chunks a thread) and the
// scalar path (h % 8 != 0, h > 8192).
TEST(CudaAddNorm, ResidualDropoutEqualsDropoutThenTheOpBitwise) {
  MCPP_REQUIRE_CUDA();
  const Case cases[] = {{37, 1000}, {29, 768}, {13, 2048}, {5, 4104}, {4, 8200}, {1001, 768}};
  const float p = 0.3f;
  Tensor base = Tensor::empty({1}, DType::I64);
  base.data<int64_t>()[0] = int64_t{1} << 36;
  const Tensor base_d = base.to(Device::CUDA);
  const PhiloxKey abs{.seed = 77, .offset = 5 + (uint64_t{1} << 36)};
  const PhiloxKey rel{.seed = 77, .offset = 5, .device_base = static_cast<const uint64_t*>(base_d.raw())};
  for (const Case& c : cases) {
    for (DType dt : float_dtypes()) {
      for (int kind : {kLayerNormBeta, kRmsNorm}) {
        for (const PhiloxKey& key : {abs, rel}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " n=" << c.n << " h=" << c.h << " kind=" << kind
                                            << " device base=" << (key.device_base != nullptr));
          const int64_t n = c.n, h = c.h;
          const bool rms = kind == kRmsNorm;
          const float eps = rms ? 1e-6f : 1e-5f;
          const Tensor a = rnd({n, h}, 31, dt, -2, 3), b = rnd({n, h}, 32, dt), g = rnd({h}, 33), beta = rnd({h}, 34);
          const Tensor ad = dev(a, dt), bd = dev(b, dt), gd = dev(g), betad = dev(beta);
          const Tensor b_before = bd.to(Device::CPU);
          const ops::ResidualDropout drop{p, key};
          // forward: dropout_fwd, then the op without dropout; and the fused op
          Tensor dropped = poisoned({n, h}, dt);
          ops::dropout_fwd(dropped, bd, p, key);
          struct Fwd {
            Tensor sum, y, mean, rstd;
          };
          auto fwd = [&](const Tensor& branch, const ops::ResidualDropout& d) {
            Fwd f{poisoned({n, h}, dt), poisoned({n, h}, dt), poisoned({n}, DType::F32), poisoned({n}, DType::F32)};
            if (rms) ops::add_rmsnorm_fwd(f.sum, f.y, f.rstd, ad, branch, gd, eps, d);
            else ops::add_layernorm_fwd(f.sum, f.y, f.mean, f.rstd, ad, branch, gd, &betad, eps, d);
            return f;
          };
          const Fwd u = fwd(dropped, {}), f = fwd(bd, drop);
          EXPECT_TRUE(same_bits(f.sum, u.sum)) << "sum";
          EXPECT_TRUE(same_bits(f.y, u.y)) << "y";
          EXPECT_TRUE(same_bits(f.rstd, u.rstd)) << "rstd";
          if (!rms) {
            EXPECT_TRUE(same_bits(f.mean, u.mean)) << "mean";
          }
          EXPECT_TRUE(same_bits(bd, b_before)) << "b was written";
          // backward: the op without dropout, then dropout_bwd of its dx; and the fused op
          const Tensor dyd = dev(rnd({n, h}, 35, dt), dt), dresd = dev(rnd({n, h}, 36, dt), dt);
          const Tensor prior = rnd({h}, 37);
          struct Bwd {
            Tensor dx, dbranch, dg, db, sr, sd;
          };
          auto bwd = [&](const ops::ResidualDropout& d) {
            Bwd o{poisoned({n, h}, dt), poisoned({n, h}, dt), Tensor::zeros({h}, DType::F32, Device::CUDA),
                  Tensor::zeros({h}, DType::F32, Device::CUDA), dev(prior), dev(prior)};
            Tensor* dbr = d.active() ? &o.dbranch : nullptr;
            if (rms) ops::add_rmsnorm_bwd(o.dx, o.dg, dyd, dresd, u.sum, gd, u.rstd, &o.sr, &o.sd, d, dbr);
            else
              ops::add_layernorm_bwd(o.dx, o.dg, &o.db, dyd, dresd, u.sum, gd, u.mean, u.rstd, &o.sr, &o.sd, d, dbr);
            return o;
          };
          Bwd ub = bwd({}), fb = bwd(drop);
          ops::dropout_bwd(ub.dbranch, ub.dx, p, key);
          EXPECT_TRUE(same_bits(fb.dx, ub.dx)) << "dx";
          EXPECT_TRUE(same_bits(fb.dbranch, ub.dbranch)) << "dbranch";
          EXPECT_TRUE(same_bits(fb.dg, ub.dg)) << "dgamma";
          if (!rms) {
            EXPECT_TRUE(same_bits(fb.db, ub.db)) << "dbeta";
          }
          EXPECT_TRUE(same_bits(fb.sr, ub.sr)) << "dres sum";
          const Tensor dbh = host(fb.dbranch), sdh = host(fb.sd);
          double worst = 0;
          int64_t kept = 0;
          for (int64_t j = 0; j < h; ++j) {  // float64 column sums of dbranch as stored
            double d = prior.data<float>()[j];
            for (int64_t i = 0; i < n; ++i) {
              const float v = dbh.data<float>()[i * h + j];
              d += v, kept += v != 0.0f;
            }
            worst = std::max(worst, std::abs(sdh.data<float>()[j] - d) / (1 + std::abs(d)));
          }
          EXPECT_LT(worst, 1e-5);
          const double frac = static_cast<double>(kept) / static_cast<double>(n * h);
          EXPECT_NEAR(frac, 1.0 - p, 7 * std::sqrt(p * (1 - p) / static_cast<double>(n * h))) << "kept fraction";
        }
      }
    }
  }
}

TEST(CudaAddNorm, BadOperandsNameTheField) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 4, h = 16;
  Tensor a = dev(rnd({n, h}, 1)), b = dev(rnd({n, h}, 2)), bad = dev(rnd({n, h + 8}, 3)), g = dev(rnd({h}, 4));
  Tensor sum = Tensor::empty({n, h}, DType::F32, Device::CUDA), y = Tensor::empty({n, h}, DType::F32, Device::CUDA);
  Tensor mean = Tensor::empty({n}, DType::F32, Device::CUDA), rstd = Tensor::empty({n}, DType::F32, Device::CUDA);
  try {
    ops::add_layernorm_fwd(sum, y, mean, rstd, a, bad, g, nullptr, 1e-5f, {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add_layernorm_fwd: b must have the shape of sum"), std::string::npos)
        << e.what();
  }
  ops::add_layernorm_fwd(sum, y, mean, rstd, a, b, g, nullptr, 1e-5f, {});
  Tensor dx = Tensor::empty({n, h}, DType::F32, Device::CUDA), dg = Tensor::zeros({h}, DType::F32, Device::CUDA);
  EXPECT_THROW(ops::add_layernorm_bwd(dx, dg, nullptr, a, bad, sum, g, mean, rstd, nullptr, nullptr, {}, nullptr),
               Error);
  try {
    ops::add_rmsnorm_bwd(dx, dg, a, dx, sum, g, rstd, nullptr, nullptr, {}, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dres must not alias dx"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mcpp
