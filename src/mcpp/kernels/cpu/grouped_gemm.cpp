// CPU grouped GEMMs of the MoE experts (ops.inc grouped_linear_*), the reference for the CUDA kernels: each group's
// rows run through cpu::linear_fwd / the GEMMs of cpu::linear_bwd (linear_gelu_fwd / linear_dgelu_bwd for the fused
// ops) on row views of the grouped buffer, so the grouped path is bitwise the per-expert (SequentialMLP) path.
// float32; counts int64 [G] read on the host.
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/kernels/cpu/checks.h"
#include "mcpp/kernels/ops.h"

namespace mcpp::ops::cpu {
namespace {
// The first row of each group and the rows' total (checked against m).
std::vector<int64_t> group_offsets(const char* op, const Tensor& counts, int64_t m) {
  const int64_t g = counts.size(0);
  const int64_t* c = counts.data<int64_t>();
  std::vector<int64_t> off(static_cast<size_t>(g + 1), 0);
  for (int64_t i = 0; i < g; ++i) {
    MCPP_CHECK(c[i] >= 0, "{}: group {} has {} rows", op, i, c[i]);
    off[static_cast<size_t>(i + 1)] = off[static_cast<size_t>(i)] + c[i];
  }
  MCPP_CHECK(off.back() == m, "{}: the groups' rows sum to {}, the buffer has {}", op, off.back(), m);
  return off;
}

// fn(g, rows) for every group with rows (off: group_offsets), rows(t) = t's rows of group g.
template <class F>
void for_groups(const std::vector<int64_t>& off, F&& fn) {
  for (size_t g = 0; g + 1 < off.size(); ++g) {
    const int64_t r0 = off[g], r = off[g + 1] - r0;
    if (r > 0) fn(g, [&](const Tensor& t) { return t.narrow0(r0, r); });
  }
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& pre_act) {
  MCPP_CHECK(pre_act.shape() == a.shape(), "{}: pre_act must have the shape of the output; got {} and {}", op,
             pre_act.str(), a.str());
}
}  // namespace

void grouped_linear_fwd(Tensor& y, const Tensor& x, const std::vector<Tensor>& w, const std::vector<Tensor>& bias,
                        const Tensor& counts, Stream stream) {
  const GroupedLinearShape s = check_grouped_linear("grouped_linear_fwd", x, y, w, bias, counts);
  for_groups(group_offsets("grouped_linear_fwd", counts, s.m), [&](size_t g, auto rows) {
    Tensor yg = rows(y);  // [r, out] = x[r, in] @ w_g^T (+ b_g)
    cpu::linear_fwd(yg, rows(x), w[g], bias.empty() ? nullptr : &bias[g], stream);
  });
}

void grouped_linear_dgrad(Tensor& dx, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& counts,
                          Stream stream) {
  const GroupedLinearShape s = check_grouped_linear("grouped_linear_dgrad", dx, dy, w, {}, counts);
  for_groups(group_offsets("grouped_linear_dgrad", counts, s.m), [&](size_t g, auto rows) {
    Tensor dxg = rows(dx);  // [r, in] = dy[r, out] @ w_g[out, in]  (linear_bwd's dgrad GEMM)
    detail::require_cpu_f32("grouped_linear_dgrad", "dx", dxg);
    cpu::gemm(dxg, rows(dy), w[g], GemmOptions{}, stream);
  });
}

void grouped_linear_gelu_fwd(Tensor& act, Tensor& pre_act, const Tensor& x, const std::vector<Tensor>& w,
                             const std::vector<Tensor>& bias, const Tensor& counts, Stream stream) {
  const GroupedLinearShape s = check_grouped_linear("grouped_linear_gelu_fwd", x, act, w, bias, counts);
  check_same_shape("grouped_linear_gelu_fwd", act, pre_act);
  for_groups(group_offsets("grouped_linear_gelu_fwd", counts, s.m), [&](size_t g, auto rows) {
    Tensor ag = rows(act), pg = rows(pre_act);  // [r, out]: gelu(x_g w_g^T (+ b_g)), its input
    cpu::linear_gelu_fwd(ag, pg, rows(x), w[g], bias.empty() ? nullptr : &bias[g], stream);
  });
}

void grouped_linear_dgelu_bwd(Tensor& dpre, const Tensor& dy, const std::vector<Tensor>& w, const Tensor& pre_act,
                              const Tensor& counts, Stream stream) {
  const GroupedLinearShape s = check_grouped_linear("grouped_linear_dgelu_bwd", dpre, dy, w, {}, counts);
  check_same_shape("grouped_linear_dgelu_bwd", dpre, pre_act);
  for_groups(group_offsets("grouped_linear_dgelu_bwd", counts, s.m), [&](size_t g, auto rows) {
    Tensor dg = rows(dpre);  // [r, in] = (dy_g[r, out] @ w_g[out, in]) * gelu'(pre_act_g)
    cpu::linear_dgelu_bwd(dg, nullptr, rows(dy), w[g], rows(pre_act), stream);
  });
}

void grouped_linear_wgrad(std::vector<Tensor>& dw_acc, std::vector<Tensor>& db_acc, const Tensor& dy, const Tensor& x,
                          const Tensor& counts, GradWrite grad_write, Stream stream) {
  std::vector<Tensor> dws(dw_acc.begin(), dw_acc.end()), dbs(db_acc.begin(), db_acc.end());
  const GroupedLinearShape s = check_grouped_linear("grouped_linear_wgrad", x, dy, dws, dbs, counts);
  const std::vector<int64_t> off = group_offsets("grouped_linear_wgrad", counts, s.m);
  const bool overwrite = grad_write == GradWrite::Overwrite;
  for (int64_t g = 0; g < s.groups; ++g) {
    const int64_t r0 = off[static_cast<size_t>(g)], r = off[static_cast<size_t>(g + 1)] - r0;
    Tensor* db = db_acc.empty() ? nullptr : &db_acc[static_cast<size_t>(g)];
    Tensor& dw = dw_acc[static_cast<size_t>(g)];
    if (r == 0) {  // no rows: Overwrite writes the zero gradient, Accumulate adds nothing
      if (overwrite) {
        dw.zero_();
        if (db) db->zero_();
      }
      continue;
    }
    // dw_g[out, in] (+)= dy_g^T @ x_g, db_g (+)= column sums of dy_g: linear_bwd without its dgrad
    cpu::linear_bwd(nullptr, dw, db, dy.narrow0(r0, r), x.narrow0(r0, r), dw, grad_write, stream);
  }
}

}  // namespace mcpp::ops::cpu
