// The ring attention's per-rank steps (transformer/ring_attention.h) run for every rank of a simulated
// context-parallel group in one process, no communicator: rank r's step i is handed the key / value rows of rank
// (r - i) mod cp, its dk / dv shares go straight to that owner's accumulators. What the ring's messages would
// carry is the same, so the result must equal one causal attention over the whole sequence; the routing itself
// is tested through mpiexec (tests/oracle/cli/context_parallel_check.py).
#pragma once
#include <vector>

#include "mcpp/core/tensor.h"
#include "mcpp/kernels/ops.h"
#include "mcpp/transformer/context_parallel.h"
#include "mcpp/transformer/ring_attention.h"

namespace mcpp::testing {

struct RingSimResult {
  Tensor out, lse, dq, dk, dv;  // CPU float32 in sequence order: [S, b, nq|ng, d] and lse [b, nq, S]
};

// q / dout [S, b, nq, d], k / v [S, b, ng, d]: CPU float32 over the whole sequence; each rank's rows go to
// `device` as `dt`.
inline RingSimResult simulate_ring(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, int cp,
                                   const ops::AttentionOptions& opt, Device device, DType dt) {
  const int64_t S = q.size(0), b = q.size(1), nq = q.size(2), c = S / (2 * cp);
  auto local = [&](const Tensor& t, int r) { return cp_take_rows(t, cp_rows(S, cp, r, true)).to(dt).to(device); };
  std::vector<Tensor> qs, ks, vs, ds, outs, lses;
  for (int r = 0; r < cp; ++r) {
    qs.push_back(local(q, r)), ks.push_back(local(k, r)), vs.push_back(local(v, r)), ds.push_back(local(dout, r));
  }
  for (int r = 0; r < cp; ++r) {
    Tensor o_acc = Tensor::empty(qs[r].shape(), DType::F32, device);
    Tensor lse = Tensor::empty({2, b, nq, c}, DType::F32, device);
    for (int i = 0; i < cp; ++i) {
      const int j = ((r - i) % cp + cp) % cp;
      ring_attention::forward_step(o_acc, lse, qs[r], ks[j], vs[j], i, r, cp, opt);
    }
    Tensor out = Tensor::empty(qs[r].shape(), dt, device);
    ops::cast(out, o_acc);
    outs.push_back(out), lses.push_back(lse);
  }
  std::vector<Tensor> dq, dk, dv;
  for (int r = 0; r < cp; ++r) {
    dq.push_back(Tensor::zeros(qs[r].shape(), DType::F32, device));
    dk.push_back(Tensor::zeros(ks[r].shape(), DType::F32, device));
    dv.push_back(Tensor::zeros(vs[r].shape(), DType::F32, device));
  }
  for (int r = 0; r < cp; ++r)
    for (int i = 0; i < cp; ++i) {
      const int j = ((r - i) % cp + cp) % cp;
      ring_attention::backward_step(dq[r], dk[j], dv[j], ds[r], qs[r], ks[j], vs[j], outs[r], lses[r], i, r, cp, opt);
    }
  // back to sequence order on the host
  RingSimResult res{Tensor::empty(q.shape()), Tensor::empty({b, nq, S}), Tensor::empty(q.shape()),
                    Tensor::empty(k.shape()), Tensor::empty(v.shape())};
  for (int r = 0; r < cp; ++r) {
    const std::vector<CpRows> rows = cp_rows(S, cp, r, true);
    const Tensor o_h = outs[r].to(Device::CPU).to(DType::F32), l_h = lses[r].to(Device::CPU);
    const Tensor dq_h = dq[r].to(Device::CPU), dk_h = dk[r].to(Device::CPU), dv_h = dv[r].to(Device::CPU);
    int64_t at = 0;
    for (size_t h = 0; h < rows.size(); ++h) {
      const CpRows& rr = rows[h];
      for (auto [dst, src] : {std::pair{&res.out, &o_h}, {&res.dq, &dq_h}, {&res.dk, &dk_h}, {&res.dv, &dv_h}}) {
        Tensor d = dst->narrow0(rr.first, rr.count);
        d.copy_from(src->narrow0(at, rr.count));
      }
      const float* src = l_h.data<float>() + static_cast<int64_t>(h) * b * nq * c;  // lse [2, b, nq, c]
      for (int64_t bh = 0; bh < b * nq; ++bh)
        for (int64_t i = 0; i < rr.count; ++i) res.lse.data<float>()[bh * S + rr.first + i] = src[bh * c + i];
      at += rr.count;
    }
  }
  return res;
}

}  // namespace mcpp::testing
