#!/usr/bin/python3
"""PyTorch oracle for mcpp's flash attention (kernels/cpu/attention.cpp).

Usage: attention_ref.py DIR
DIR holds meta.txt ("s b nq ng d causal scale") and raw little-endian float32 files written by
tests/kernels/attention_test.cpp: inputs q.bin [s,b,nq,d], k.bin/v.bin [s,b,ng,d], dout.bin [s,b,nq,d] and
the kernel's outputs o.bin [s,b,nq,d], lse.bin [b,nq,s], dq.bin, dk.bin, dv.bin.

The reference is plain softmax(scale * Q K^T + causal mask) V in float64, written out by hand (torch 1.13,
no scaled_dot_product_attention); GQA repeats each kv group nq/ng times; grads come from autograd of
sum(dout * o). Prints the max relative errors; exit status 1 when any exceeds its tolerance.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from raw_f32 import load  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: attention_ref.py DIR")
    d = sys.argv[1]
    with open(os.path.join(d, "meta.txt")) as f:
        s, b, nq, ng, hd, causal, scale = f.read().split()
    s, b, nq, ng, hd, causal, scale = int(s), int(b), int(nq), int(ng), int(hd), causal == "1", float(scale)

    q = load(d, "q", (s, b, nq, hd)).requires_grad_()
    k = load(d, "k", (s, b, ng, hd)).requires_grad_()
    v = load(d, "v", (s, b, ng, hd)).requires_grad_()
    dout = load(d, "dout", (s, b, nq, hd))

    # [s, b, n, d] -> [b, n, s, d]; kv groups repeated so query head h reads group h // (nq / ng).
    qh = q.permute(1, 2, 0, 3)
    kh = k.permute(1, 2, 0, 3).repeat_interleave(nq // ng, dim=1)
    vh = v.permute(1, 2, 0, 3).repeat_interleave(nq // ng, dim=1)
    scores = scale * torch.matmul(qh, kh.transpose(-1, -2))  # [b, nq, s, s]
    if causal:
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)  # key j > query i
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, nq, s]
    probs = torch.softmax(scores, dim=-1)
    o = torch.matmul(probs, vh).permute(2, 0, 1, 3)  # [s, b, nq, d]
    (o * dout).sum().backward()

    def rel(got, want):  # normwise: max abs error over max |want| (fp32 rounding scales with the terms)
        return float((got - want).abs().max() / want.abs().max())

    # Same tolerances as the float64 C++ reference test: fp32 rounding is ~1e-6 of the largest value.
    checks = [
        ("o", rel(load(d, "o", (s, b, nq, hd)), o.detach()), 1e-5),
        ("lse", rel(load(d, "lse", (b, nq, s)), lse.detach()), 1e-5),
        ("dq", rel(load(d, "dq", (s, b, nq, hd)), q.grad), 3e-5),
        ("dk", rel(load(d, "dk", (s, b, ng, hd)), k.grad), 3e-5),
        ("dv", rel(load(d, "dv", (s, b, ng, hd)), v.grad), 3e-5),
    ]
    ok = True
    for name, err, tol in checks:
        flag = "ok" if err < tol else "FAIL"
        ok &= err < tol
        print(f"{name}: normwise rel err {err:.3e} (tol {tol:.0e}) {flag}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
