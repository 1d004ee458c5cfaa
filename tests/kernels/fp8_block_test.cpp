// The CPU FP8 blockwise-scaling emulation (kernels/cpu/fp8_block.cpp; --fp8-recipe blockwise), the oracle of the CUDA
// block-scaled path:
//   - fp8_block_scale: Transformer Engine's compute_scale_from_amax with power-of-2 scales, case by case;
//   - fp8_block_quantize (1x128 tiles, 128x128 blocks, e4m3 / e5m2) bit for bit against a float64 numpy oracle written
//     from the definitions (tests/oracle/fp8_block_ref.py), including the wgrad's 128x1 tiles (the transposed
//     tensor's 1x128) — on data whose blocks span 2^-30..2^20, with an all-zero block and a block whose amax sits at
//     the format's max;
//   - fp8_block_linear_fwd / _bwd against the oracle's float64 GEMMs of its dequantized operands, within the fp32
//     accumulation bound (K 2^-24 sum |a_k b_k|, the classic gamma_K bound; K = the reduction length);
//   - the op against the unquantized fp32 linear within FP8's error, and its shape errors.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp {
namespace {

using ops::Fp8Block;
using ops::Fp8Format;

TEST(Fp8BlockScale, PowerOfTwoBelowMaxOverAmax) {
  EXPECT_EQ(ops::fp8_block_scale(448.0f, Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(ops::fp8_block_scale(1.0f, Fp8Format::E4M3), 256.0f);       // 448 -> 256
  EXPECT_EQ(ops::fp8_block_scale(3.5f, Fp8Format::E4M3), 128.0f);       // exactly 128
  EXPECT_EQ(ops::fp8_block_scale(3.5000002f, Fp8Format::E4M3), 64.0f);  // just below 128 -> 64
  EXPECT_EQ(ops::fp8_block_scale(1.0f, Fp8Format::E5M2), 32768.0f);     // 57344 -> 2^15
  EXPECT_EQ(ops::fp8_block_scale(1e6f, Fp8Format::E4M3), std::ldexp(1.0f, -12));  // 4.48e-4 -> 2^-12
  EXPECT_EQ(ops::fp8_block_scale(0.0f, Fp8Format::E4M3), 1.0f);  // an all-zero block
  EXPECT_EQ(ops::fp8_block_scale(INFINITY, Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(ops::fp8_block_scale(NAN, Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(ops::fp8_block_scale(1e-44f, Fp8Format::E4M3), std::ldexp(1.0f, 127));  // overflow: FLT_MAX's power of 2
}

// x [n, fin], w [fout, fin], dy [n, fout] with one magnitude per 128-block region (2^-30 .. 2^20), one all-zero
// 128x128 region of x (a zero tile and a zero 128x1 column tile), and one element at 448 in w (scale exactly 1).
struct Operands {
  Tensor x, w, dy;
};
Operands operands(int64_t n, int64_t fin, int64_t fout) {
  Operands o{testing::random_tensor({n, fin}, 11), testing::random_tensor({fout, fin}, 12),
             testing::random_tensor({n, fout}, 13)};
  auto spread = [](Tensor& t, int salt) {
    const int64_t rows = t.size(0), cols = t.size(1);
    float* p = t.data<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        p[r * cols + c] *= std::ldexp(1.0f, static_cast<int>(((r / 64) * 7 + (c / 96) * 5 + salt) % 51) - 30);
  };
  spread(o.x, 0);
  spread(o.w, 3);
  spread(o.dy, 8);
  for (int64_t r = 128; r < 256 && r < n; ++r)
    for (int64_t c = 0; c < 128; ++c) o.x.data<float>()[r * fin + c] = 0.0f;
  o.w.data<float>()[5] = 448.0f;
  return o;
}

std::vector<double> run_oracle(const Operands& o, int64_t n, int64_t fin, int64_t fout, const char* dy_format) {
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_fp8_block_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto in_path = dir / "in.f32", out_path = dir / "out.f64";
  {
    std::ofstream f(in_path, std::ios::binary);
    for (const Tensor* t : {&o.x, &o.w, &o.dy}) f.write(static_cast<const char*>(t->raw()), t->nbytes());
  }
  const std::string cmd = fmt::format("{}{}/tests/oracle/fp8_block_ref.py {} {} {} {} {} {} 2>&1",
                                      mcpp::test::oracle_python(), MCPP_SOURCE_DIR, in_path.string(),
                                      out_path.string(), n, fin, fout, dy_format);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string log;
  char buf[256];
  while (pipe && std::fgets(buf, sizeof buf, pipe)) log += buf;
  const int rc = pipe ? ::pclose(pipe) : -1;
  EXPECT_EQ(rc, 0) << cmd << "\n" << log;
  std::vector<double> out(static_cast<size_t>(std::filesystem::exists(out_path) ? std::filesystem::file_size(out_path) / 8 : 0));
  std::ifstream f(out_path, std::ios::binary);
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size() * 8));
  std::filesystem::remove_all(dir);
  return out;
}

Tensor transpose(const Tensor& t) {
  const int64_t r = t.size(0), c = t.size(1);
  Tensor o = Tensor::empty({c, r});
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) o.data<float>()[j * r + i] = t.data<float>()[i * c + j];
  return o;
}

// Reads `count` doubles from the oracle's output at `pos` (advanced).
std::vector<double> take(const std::vector<double>& v, size_t& pos, int64_t count) {
  EXPECT_LE(pos + static_cast<size_t>(count), v.size()) << "short oracle output";
  if (pos + static_cast<size_t>(count) > v.size()) return std::vector<double>(static_cast<size_t>(count), NAN);
  std::vector<double> out(v.begin() + static_cast<std::ptrdiff_t>(pos), v.begin() + static_cast<std::ptrdiff_t>(pos + count));
  pos += static_cast<size_t>(count);
  return out;
}

// q and scale_inv of `in` bit for bit equal to the oracle's next two arrays (q [rows, cols] and the scales in the
// op's layout; Tile128x1's q comes out transposed).
void expect_quantized(const Tensor& in, Fp8Block block, Fp8Format f, const std::vector<double>& ref, size_t& pos,
                      const std::string& what) {
  const int64_t rows = in.size(0), cols = in.size(1);
  const int64_t br = block == Fp8Block::Tile1x128 ? 1 : 128, bc = block == Fp8Block::Tile128x1 ? 1 : 128;
  const bool col_tiles = block == Fp8Block::Tile128x1;
  Tensor q = Tensor::empty(col_tiles ? Shape{cols, rows} : in.shape()), s = Tensor::empty({rows / br, cols / bc});
  ops::fp8_block_quantize(q, s, in, block, f);
  const Tensor qq = col_tiles ? transpose(q) : q, &ss = s;
  const std::vector<double> rq = take(ref, pos, qq.numel()), rs = take(ref, pos, ss.numel());
  int64_t bad = 0;
  for (int64_t i = 0; i < qq.numel() && bad < 5; ++i)
    if (static_cast<double>(qq.data<float>()[i]) != rq[static_cast<size_t>(i)])
      ADD_FAILURE() << what << " q[" << i << "] " << qq.data<float>()[i] << " vs " << rq[static_cast<size_t>(i)] << ++bad;
  for (int64_t i = 0; i < ss.numel() && bad < 10; ++i)
    if (static_cast<double>(ss.data<float>()[i]) != rs[static_cast<size_t>(i)])
      ADD_FAILURE() << what << " scale_inv[" << i << "] " << ss.data<float>()[i] << " vs " << rs[static_cast<size_t>(i)]
                    << ++bad;
}

// got within the fp32 accumulation bound of the float64 reference: |got - ref| <= (K + 2) 2^-24 sum |a b| + tiny.
void expect_gemm(const Tensor& got, const std::vector<double>& ref, const std::vector<double>& abs_sum, int64_t k,
                 const std::string& what) {
  const double u = std::ldexp(1.0, -24);
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    const auto j = static_cast<size_t>(i);
    const double bound = static_cast<double>(k + 2) * u * abs_sum[j] + 1e-44;
    if (!(std::fabs(static_cast<double>(got.data<float>()[i]) - ref[j]) <= bound)) {
      ADD_FAILURE() << what << "[" << i << "] " << got.data<float>()[i] << " vs " << ref[j] << " (bound " << bound << ")";
      ++bad;
    }
  }
}

TEST(Fp8BlockQuantize, AndGemmsMatchTheFloat64Oracle) {
  const int64_t n = 256, fin = 256, fout = 128;
  const Operands o = operands(n, fin, fout);
  for (const auto& [dyf, dy_name] : {std::pair{Fp8Format::E4M3, "e4m3"}, std::pair{Fp8Format::E5M2, "e5m2"}}) {
    SCOPED_TRACE(dy_name);
    const std::vector<double> ref = run_oracle(o, n, fin, fout, dy_name);
    ASSERT_FALSE(ref.empty());
    size_t pos = 0;
    expect_quantized(o.x, Fp8Block::Tile1x128, Fp8Format::E4M3, ref, pos, "x 1x128");
    expect_quantized(o.w, Fp8Block::Block128x128, Fp8Format::E4M3, ref, pos, "w 128x128");
    expect_quantized(o.dy, Fp8Block::Tile1x128, dyf, ref, pos, "dy 1x128");
    expect_quantized(o.x, Fp8Block::Tile128x1, Fp8Format::E4M3, ref, pos, "x 128x1");  // the wgrad's tiles, along n
    expect_quantized(o.dy, Fp8Block::Tile128x1, dyf, ref, pos, "dy 128x1");
    const std::vector<double> y = take(ref, pos, n * fout), ya = take(ref, pos, n * fout);
    const std::vector<double> dx = take(ref, pos, n * fin), dxa = take(ref, pos, n * fin);
    const std::vector<double> dw = take(ref, pos, fout * fin), dwa = take(ref, pos, fout * fin);
    EXPECT_EQ(pos, ref.size());

    Tensor gy = Tensor::empty({n, fout});
    ops::fp8_block_linear_fwd(gy, o.x, o.w);
    expect_gemm(gy, y, ya, fin, "y");
    Tensor gdx = Tensor::empty({n, fin}), gdw = Tensor::empty({fout, fin}), db = Tensor::zeros({fout});
    gdw.fill_(-3.0f);  // overwritten
    ops::fp8_block_linear_bwd(&gdx, gdw, &db, o.dy, o.x, o.w, dyf, ops::GradWrite::Overwrite);
    expect_gemm(gdx, dx, dxa, fout, "dx");
    expect_gemm(gdw, dw, dwa, n, "dw");
    // Accumulate: dw + the same product again (the product rounded once, then added)
    Tensor acc = gdw.clone();
    ops::fp8_block_linear_bwd(nullptr, acc, nullptr, o.dy, o.x, o.w, dyf, ops::GradWrite::Accumulate);
    for (int64_t i = 0; i < acc.numel(); i += 97) EXPECT_EQ(acc.data<float>()[i], 2.0f * gdw.data<float>()[i]) << i;
    for (int64_t c = 0; c < fout; c += 31) {  // the bias grad is the unquantized column sum
      double sum = 0.0;
      for (int64_t r = 0; r < n; ++r) sum += o.dy.data<float>()[r * fout + c];
      EXPECT_NEAR(db.data<float>()[c], sum, 1e-5 * std::fabs(sum) + 1e-30) << c;
    }
  }
}

// Against the unquantized linear: e4m3 keeps 3 mantissa bits (relative rounding error <= 2^-4 per operand; blockwise
// scaling keeps every element in the normal range unless it is 2^-9 below its block's amax), so for O(1) uniform
// data over K = 256 the GEMM error stays within a few percent of the output's RMS.
TEST(Fp8BlockLinear, FollowsTheFp32LinearWithinFp8Error) {
  const int64_t n = 128, fin = 256, fout = 128;
  Tensor x = testing::random_tensor({n, fin}, 21), w = testing::random_tensor({fout, fin}, 22);
  Tensor y = Tensor::empty({n, fout}), ref = Tensor::empty({n, fout});
  ops::fp8_block_linear_fwd(y, x, w);
  ops::linear_fwd(ref, x, w, nullptr);
  double err = 0.0, norm = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    const double d = y.data<float>()[i] - ref.data<float>()[i];
    err += d * d;
    norm += static_cast<double>(ref.data<float>()[i]) * ref.data<float>()[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 0.04);  // measured ~0.03: two e4m3 operands, unbiased rounding
  EXPECT_GT(std::sqrt(err / norm), 1e-4);  // the casts are in the path
}

TEST(Fp8BlockLinear, ShapesNotMultiplesOf128AreNamedErrors) {
  Tensor x = Tensor::zeros({128, 96}), w = Tensor::zeros({128, 96}), y = Tensor::empty({128, 128});
  try {
    ops::fp8_block_linear_fwd(y, x, w);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 128"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in 96"), std::string::npos) << e.what();
  }
  Tensor q = Tensor::empty({64, 128}), s = Tensor::empty({64, 1});
  EXPECT_THROW(ops::fp8_block_quantize(q, s, Tensor::zeros({64, 128}), Fp8Block::Block128x128, Fp8Format::E4M3),
               Error);
}

}  // namespace
}  // namespace mcpp
