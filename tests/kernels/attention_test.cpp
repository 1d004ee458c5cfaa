// Tests for ops::cpu::flash_attention_fwd / _bwd against a float64 reference that materializes the full
// [s, s] score matrix (MHA and GQA, causal and not, s on and off the 64-row tile; with attention dropout:
// the reference applies the mask of AttentionOptions element by element), against central finite
// differences of that reference, for run-to-run determinism across thread counts, and at s = 4096 for
// the no-[s, s]-buffer property (peak RSS), and against PyTorch (tests/oracle/attention_ref.py, run through
// /usr/bin/python3 on inputs and outputs this test writes to a temp dir).
#include <omp.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/grad_check.h"
#include "mcpp/core/error.h"
#include "mcpp/kernels/ops.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp {
namespace {

struct AttnCase {
  int64_t s, b, nq, ng, d;
  bool causal;
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(d)); }
};

struct RowRef {
  std::vector<double> o, dq;
  double lse = 0.0;
};

// Naive attention in float64 with the full score row for every query (s x s work, no tiling):
// o_i = sum_j softmax_j(scale q_i.k_j) v_j, and the analytic backward of L = sum(dout * o).
// With drop_p > 0: P z in place of P, z_ij = [philox_uniform_at(key, ((bb nq + h) s + i) s + j) >= p] / (1 - p).
struct AttnRef {
  AttnCase c;
  std::vector<double> q, k, v, dout;  // inputs as stored in fp32, [s, b, nq|ng, d]
  std::vector<double> o, lse, dq, dk, dv;
  float drop_p = 0.0f;
  PhiloxKey key{.seed = 1234, .offset = 77};

  explicit AttnRef(const AttnCase& cs, float p = 0.0f) : c(cs), drop_p(p) {}
  double mask(int64_t bb, int64_t h, int64_t i, int64_t j) const {
    if (drop_p == 0.0f) return 1.0;
    const uint64_t idx = static_cast<uint64_t>(((bb * c.nq + h) * c.s + i) * c.s + j);
    return philox_uniform_at(key, idx) >= drop_p ? 1.0 / (1.0 - static_cast<double>(drop_p)) : 0.0;
  }
  size_t qi(int64_t i, int64_t bb, int64_t h) const { return static_cast<size_t>(((i * c.b + bb) * c.nq + h) * c.d); }
  size_t ki(int64_t j, int64_t bb, int64_t g) const { return static_cast<size_t>(((j * c.b + bb) * c.ng + g) * c.d); }

  // One query row; with dk_acc / dv_acc non-null also accumulates that row's share of dk / dv.
  RowRef row(int64_t bb, int64_t h, int64_t i, double* dk_acc = nullptr, double* dv_acc = nullptr) const {
    const int64_t g = h / (c.nq / c.ng), nk = c.causal ? i + 1 : c.s, d = c.d;
    const double scale = c.scale();
    std::vector<double> p(static_cast<size_t>(nk)), dp(static_cast<size_t>(nk));
    double mx = -INFINITY;
    for (int64_t j = 0; j < nk; ++j) {
      double sc = 0.0;
      for (int64_t x = 0; x < d; ++x) sc += q[qi(i, bb, h) + x] * k[ki(j, bb, g) + x];
      p[j] = scale * sc;
      mx = std::max(mx, p[j]);
    }
    double sum = 0.0;
    for (double& e : p) sum += (e = std::exp(e - mx));
    RowRef r{std::vector<double>(d, 0.0), std::vector<double>(d, 0.0), mx + std::log(sum)};
    for (double& e : p) e /= sum;
    double D = 0.0;  // sum_j p_j dp_j (dp_j: the grad of p_j through the mask, z_j dO.v_j)
    std::vector<double> z(static_cast<size_t>(nk));
    for (int64_t j = 0; j < nk; ++j) {
      z[j] = mask(bb, h, i, j);
      for (int64_t x = 0; x < d; ++x) r.o[x] += p[j] * z[j] * v[ki(j, bb, g) + x];
      for (int64_t x = 0; x < d; ++x) dp[j] += dout[qi(i, bb, h) + x] * v[ki(j, bb, g) + x];
      dp[j] *= z[j];
      D += p[j] * dp[j];
    }
    for (int64_t j = 0; j < nk; ++j) {
      const double ds = p[j] * (dp[j] - D);
      for (int64_t x = 0; x < d; ++x) {
        r.dq[x] += scale * ds * k[ki(j, bb, g) + x];
        if (dk_acc) dk_acc[ki(j, bb, g) + x] += scale * ds * q[qi(i, bb, h) + x];
        if (dv_acc) dv_acc[ki(j, bb, g) + x] += p[j] * z[j] * dout[qi(i, bb, h) + x];
      }
    }
    return r;
  }

  void run(bool grads) {
    o.assign(q.size(), 0.0);
    lse.assign(static_cast<size_t>(c.b * c.nq * c.s), 0.0);
    dq.assign(q.size(), 0.0);
    dk.assign(grads ? k.size() : 0, 0.0);
    dv.assign(grads ? v.size() : 0, 0.0);
    for (int64_t bb = 0; bb < c.b; ++bb)
      for (int64_t h = 0; h < c.nq; ++h)
        for (int64_t i = 0; i < c.s; ++i) {
          RowRef r = row(bb, h, i, grads ? dk.data() : nullptr, grads ? dv.data() : nullptr);
          std::copy(r.o.begin(), r.o.end(), o.begin() + static_cast<ptrdiff_t>(qi(i, bb, h)));
          std::copy(r.dq.begin(), r.dq.end(), dq.begin() + static_cast<ptrdiff_t>(qi(i, bb, h)));
          lse[static_cast<size_t>((bb * c.nq + h) * c.s + i)] = r.lse;
        }
  }
  void forward() { run(false); }
  void backward() { run(true); }
};

struct AttnRun {
  Tensor q, k, v, dout, o, lse, dq, dk, dv;
};

// Random inputs for case c, the kernel's forward and (optionally) backward.
AttnRun run_kernel(const AttnCase& c, AttnRef& ref, bool backward) {
  AttnRun r;
  r.q = testing::random_tensor({c.s, c.b, c.nq, c.d}, 11, &ref.q);
  r.k = testing::random_tensor({c.s, c.b, c.ng, c.d}, 12, &ref.k);
  r.v = testing::random_tensor({c.s, c.b, c.ng, c.d}, 13, &ref.v);
  r.dout = testing::random_tensor({c.s, c.b, c.nq, c.d}, 14, &ref.dout);
  r.o = Tensor::empty(r.q.shape());
  r.lse = Tensor::empty({c.b, c.nq, c.s});
  ops::AttentionOptions opt{
      .softmax_scale = c.scale(), .causal = c.causal, .dropout_p = ref.drop_p, .dropout_key = ref.key};
  ops::cpu::flash_attention_fwd(r.o, r.lse, r.q, r.k, r.v, opt, {});
  if (backward) {
    r.dq = Tensor::empty(r.q.shape());
    r.dk = Tensor::empty(r.k.shape());
    r.dv = Tensor::empty(r.v.shape());
    r.dq.fill_(NAN);  // overwritten, not accumulated: stale values must not leak through
    r.dk.fill_(NAN);
    r.dv.fill_(NAN);
    ops::cpu::flash_attention_bwd(r.dq, r.dk, r.dv, r.dout, r.q, r.k, r.v, r.o, r.lse, opt, {});
  }
  return r;
}

// Normwise relative error max_i |got_i - want_i| / max_i |want_i|: fp32 sums of O(s) terms of mixed sign
// carry rounding relative to the size of the terms, not of a (possibly cancelled) result element. The
// 1e-2 floor covers all-zero references (s = 1: dq = dk = 0 exactly, the kernel leaves ~1e-7 rounding).
double norm_err(const Tensor& got, const std::vector<double>& want) {
  double scale = 1e-2;
  for (double w : want) scale = std::max(scale, std::abs(w));
  return testing::max_abs_error(testing::to_doubles(got), want) / scale;
}

std::string name(const AttnCase& c) {
  return "s=" + std::to_string(c.s) + " b=" + std::to_string(c.b) + " nq=" + std::to_string(c.nq) +
         " ng=" + std::to_string(c.ng) + " d=" + std::to_string(c.d) + (c.causal ? " causal" : " full");
}

TEST(FlashAttentionCpu, ForwardAndBackwardMatchFloat64Reference) {
  for (int64_t s : {1, 7, 64, 65, 130})
    for (int64_t d : {16, 32, 64})
      for (auto [nq, ng] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {6, 1}})
        for (bool causal : {true, false}) {
          AttnCase c{.s = s, .b = 2, .nq = nq, .ng = ng, .d = d, .causal = causal};
          AttnRef ref(c);
          AttnRun r = run_kernel(c, ref, /*backward=*/true);
          ref.backward();
          SCOPED_TRACE(name(c));
          // fp32 dot products over d <= 64 and sums over s <= 130 keys: rounding ~1e-6 of the largest
          // value; 1e-5 leaves margin and still catches any mask / GQA / tiling bug (errors O(0.1)).
          EXPECT_LT(norm_err(r.o, ref.o), 1e-5);
          EXPECT_LT(testing::max_rel_error(r.lse, ref.lse), 1e-5);  // lse = O(log s), well away from 0
          // grads chain two more fp32 products (dP = dO V^T, then dS K / dS^T Q / P^T dO) and, for GQA
          // dk/dv, sum over up to 6 heads: 3e-5.
          EXPECT_LT(norm_err(r.dq, ref.dq), 3e-5);
          EXPECT_LT(norm_err(r.dk, ref.dk), 3e-5);
          EXPECT_LT(norm_err(r.dv, ref.dv), 3e-5);
        }
}

// Attention dropout: the same tolerances as without (the mask only zeroes and scales terms); p = 0.5 drops
// half the probabilities, so a kernel that ignored the mask or drew it at other indices is off by O(1).
TEST(FlashAttentionCpu, DropoutMatchesFloat64Reference) {
  for (float p : {0.1f, 0.5f})
    for (int64_t s : {7, 65, 130})
      for (auto [nq, ng] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}})
        for (bool causal : {true, false}) {
          AttnCase c{.s = s, .b = 2, .nq = nq, .ng = ng, .d = 32, .causal = causal};
          AttnRef ref(c, p);
          AttnRun r = run_kernel(c, ref, /*backward=*/true);
          ref.backward();
          SCOPED_TRACE(name(c) + " p=" + std::to_string(p));
          EXPECT_LT(norm_err(r.o, ref.o), 1e-5);
          EXPECT_LT(testing::max_rel_error(r.lse, ref.lse), 1e-5);  // the undropped softmax's
          EXPECT_LT(norm_err(r.dq, ref.dq), 3e-5);
          EXPECT_LT(norm_err(r.dk, ref.dk), 3e-5);
          EXPECT_LT(norm_err(r.dv, ref.dv), 3e-5);
        }
  // The key names the mask: another offset gives other outputs.
  AttnCase c{.s = 65, .b = 1, .nq = 2, .ng = 2, .d = 16, .causal = true};
  AttnRef ref(c, 0.5f);
  AttnRun a = run_kernel(c, ref, false);
  ref.key.offset += 1;
  AttnRun b = run_kernel(c, ref, false);
  EXPECT_GT(testing::max_abs_error(testing::to_doubles(a.o), testing::to_doubles(b.o)), 1e-2);
}

TEST(FlashAttentionCpu, DropoutRejectsBadProbabilityAndDeviceKeys) {
  Tensor q = Tensor::zeros({8, 1, 2, 16}), o = Tensor::empty(q.shape()), lse = Tensor::empty({1, 2, 8});
  for (float p : {-0.1f, 1.0f, NAN}) {
    try {
      ops::cpu::flash_attention_fwd(o, lse, q, q, q, {.dropout_p = p}, {});
      FAIL() << "dropout_p=" << p << " must be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("attention dropout probability must be in [0, 1)"), std::string::npos)
          << e.what();
    }
  }
  const uint64_t base = 0;
  const ops::AttentionOptions graph_key{.dropout_p = 0.1f, .dropout_key = {.device_base = &base}};
  EXPECT_THROW(ops::cpu::flash_attention_fwd(o, lse, q, q, q, graph_key, {}), Error);
}

TEST(FlashAttentionCpu, BackwardMatchesFiniteDifferences) {
  // s = 67 crosses the 64-row tile; GQA (2 heads per group) and MHA; causal and not.
  // The last two with attention dropout (p = 0.3): a fixed key makes the mask a constant of the function.
  const std::pair<AttnCase, float> cases[] = {{{.s = 5, .b = 1, .nq = 2, .ng = 1, .d = 4, .causal = true}, 0.0f},
                                              {{.s = 67, .b = 1, .nq = 2, .ng = 1, .d = 4, .causal = true}, 0.0f},
                                              {{.s = 67, .b = 2, .nq = 2, .ng = 2, .d = 3, .causal = false}, 0.0f},
                                              {{.s = 67, .b = 1, .nq = 2, .ng = 1, .d = 4, .causal = true}, 0.3f},
                                              {{.s = 9, .b = 2, .nq = 2, .ng = 2, .d = 3, .causal = false}, 0.3f}};
  for (auto [c, p] : cases) {
    SCOPED_TRACE(name(c) + " p=" + std::to_string(p));
    AttnRef ref(c, p);
    AttnRun r = run_kernel(c, ref, /*backward=*/true);
    // L(x) = sum(dout * attention(x)) in double, x = one of q / k / v.
    auto grad_of = [&](std::vector<double> AttnRef::*field) {
      return testing::numeric_grad(
          [&](const std::vector<double>& x) {
            AttnRef probe = ref;
            probe.*field = x;
            probe.forward();
            return testing::dot(probe.dout, probe.o);
          },
          ref.*field);
    };
    // Central differences are good to ~1e-9 here (grad_check.h); the fp32 kernel's rounding dominates.
    EXPECT_LT(norm_err(r.dq, grad_of(&AttnRef::q)), 3e-5);
    EXPECT_LT(norm_err(r.dk, grad_of(&AttnRef::k)), 3e-5);
    EXPECT_LT(norm_err(r.dv, grad_of(&AttnRef::v)), 3e-5);
  }
}

TEST(FlashAttentionCpu, BackwardIsBitwiseDeterministicAcrossThreadCounts) {
  AttnCase c{.s = 200, .b = 2, .nq = 4, .ng = 2, .d = 16, .causal = true};
  AttnRef ref(c);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  AttnRun one = run_kernel(c, ref, true);
  omp_set_num_threads(3);
  AttnRun three = run_kernel(c, ref, true);
  omp_set_num_threads(saved);
  for (auto [a, b] : {std::pair{&one.dq, &three.dq}, {&one.dk, &three.dk}, {&one.dv, &three.dv}})
    EXPECT_EQ(testing::to_doubles(*a), testing::to_doubles(*b));  // exact equality, not a tolerance
}

TEST(FlashAttentionCpu, RejectsBadShapes) {
  Tensor q = Tensor::zeros({8, 1, 3, 16}), kv = Tensor::zeros({8, 1, 2, 16});
  Tensor o = Tensor::empty(q.shape()), lse = Tensor::empty({1, 3, 8});
  try {
    ops::cpu::flash_attention_fwd(o, lse, q, kv, kv, {}, {});
    FAIL() << "nq=3 with ng=2 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of kv groups"), std::string::npos) << e.what();
  }
  Tensor q4 = Tensor::zeros({8, 1, 4, 16}), o4 = Tensor::empty(q4.shape()), bad_lse = Tensor::empty({1, 4, 9});
  try {
    ops::cpu::flash_attention_fwd(o4, bad_lse, q4, kv, kv, {}, {});
    FAIL() << "lse of the wrong length must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lse"), std::string::npos) << e.what();
  }
}

// Peak resident set (VmHWM, kB) of this process; reset_peak() restarts it from the current RSS.
int64_t peak_rss_kb() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return f.good();
}

TEST(FlashAttentionCpu, LongSequenceNeverAllocatesScoreMatrix) {
  // s = 4096: one [s, s] float buffer per head would be 64 MiB; the flash kernel needs O(64 * 64) per thread.
  AttnCase c{.s = 4096, .b = 1, .nq = 2, .ng = 1, .d = 32, .causal = true};
  AttnRef ref(c);
  AttnRun r;
  r.q = testing::random_tensor({c.s, c.b, c.nq, c.d}, 21, &ref.q);
  r.k = testing::random_tensor({c.s, c.b, c.ng, c.d}, 22, &ref.k);
  r.v = testing::random_tensor({c.s, c.b, c.ng, c.d}, 23, &ref.v);
  r.dout = testing::random_tensor({c.s, c.b, c.nq, c.d}, 24, &ref.dout);
  for (Tensor* t : {&r.o, &r.dq}) *t = Tensor::zeros(r.q.shape());  // pages touched before measuring
  for (Tensor* t : {&r.dk, &r.dv}) *t = Tensor::zeros(r.k.shape());
  r.lse = Tensor::zeros({c.b, c.nq, c.s});
  ops::AttentionOptions opt{.softmax_scale = c.scale(), .causal = true};
  ASSERT_TRUE(reset_peak()) << "cannot reset VmHWM through /proc/self/clear_refs";
  const int64_t before = peak_rss_kb();
  ops::cpu::flash_attention_fwd(r.o, r.lse, r.q, r.k, r.v, opt, {});
  ops::cpu::flash_attention_bwd(r.dq, r.dk, r.dv, r.dout, r.q, r.k, r.v, r.o, r.lse, opt, {});
  const int64_t grown_kb = peak_rss_kb() - before;
  // Allowed growth: D[b, nq, s] (32 KiB), per-thread tiles, allocator slack — far below one 64 MiB [s, s].
  EXPECT_LT(grown_kb, 16 * 1024) << "peak RSS grew by " << grown_kb << " kB";
  // Sampled query rows (tile edges, middle, last) against the float64 reference for o, lse and dq.
  for (int64_t i : {0, 1, 63, 64, 2047, 4095}) {
    SCOPED_TRACE("row " + std::to_string(i));
    for (int64_t h = 0; h < c.nq; ++h) {
      RowRef row = ref.row(0, h, i);
      const float* o = r.o.data<float>() + (i * c.nq + h) * c.d;
      const float* dq = r.dq.data<float>() + (i * c.nq + h) * c.d;
      for (int64_t x = 0; x < c.d; ++x) {
        // Inputs in [-1, 1) make |o|, |dq| <= ~1; sums over up to 4096 keys in fp32: 1e-5 absolute.
        EXPECT_NEAR(o[x], row.o[x], 1e-5);
        EXPECT_NEAR(dq[x], row.dq[x], 1e-5);
      }
      EXPECT_NEAR(r.lse.data<float>()[h * c.s + i], row.lse, 1e-5 * std::abs(row.lse) + 1e-6);
    }
  }
}

void write_raw(const std::string& path, const Tensor& t) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

// Runs tests/oracle/attention_ref.py (PyTorch, float64, softmax(Q K^T) V written out by hand, grads by
// autograd) on the kernel's inputs and outputs; the script prints its max errors and exits 1 on a mismatch.
TEST(FlashAttentionCpu, MatchesTorchOracle) {
  for (AttnCase c : {AttnCase{.s = 130, .b = 2, .nq = 4, .ng = 2, .d = 32, .causal = true},
                     AttnCase{.s = 65, .b = 1, .nq = 3, .ng = 3, .d = 16, .causal = false}}) {
    SCOPED_TRACE(name(c));
    AttnRef ref(c);
    AttnRun r = run_kernel(c, ref, /*backward=*/true);
    char tmpl[] = "/tmp/mcpp_attn_oracle_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    {
      std::ofstream meta(dir + "/meta.txt");
      meta << c.s << " " << c.b << " " << c.nq << " " << c.ng << " " << c.d << " " << (c.causal ? 1 : 0) << " "
           << c.scale() << "\n";
    }
    for (auto [nm, t] : {std::pair<const char*, Tensor*>{"q", &r.q}, {"k", &r.k}, {"v", &r.v}, {"dout", &r.dout},
                         {"o", &r.o}, {"lse", &r.lse}, {"dq", &r.dq}, {"dk", &r.dk}, {"dv", &r.dv}})
      write_raw(dir + "/" + nm + ".bin", *t);
    const std::string cmd = mcpp::test::oracle_python() + MCPP_SOURCE_DIR + "/tests/oracle/attention_ref.py " +
                            dir + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr) << cmd;
    std::string out;
    for (char buf[256]; fgets(buf, sizeof buf, p);) out += buf;
    const int status = pclose(p);
    EXPECT_EQ(status, 0) << cmd << "\n" << out;
    std::system(("rm -rf " + dir).c_str());
  }
}

}  // namespace
}  // namespace mcpp
