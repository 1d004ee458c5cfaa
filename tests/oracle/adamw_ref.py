#!/usr/bin/python3
"""PyTorch oracle for ops::cpu::adamw_step (tests/kernels/adamw_test.cpp runs it).

Usage: adamw_ref.py IN OUT N STEPS LR BETA1 BETA2 EPS WEIGHT_DECAY
  IN:  float32 little-endian: param[N], then grad[STEPS][N]
  OUT: float32: for each step s = 1..STEPS: param[N], exp_avg[N], exp_avg_sq[N] after torch.optim.AdamW's
       step s (single-tensor path, foreach=False, as the C++ kernel mirrors).
Scalars are passed as the exact decimal of the C++ float values, so both sides use the same doubles.
"""
import sys

import numpy as np
import torch


def main(argv):
    if len(argv) != 10:
        sys.exit(__doc__)
    in_path, out_path = argv[1], argv[2]
    n, steps = int(argv[3]), int(argv[4])
    lr, b1, b2, eps, wd = (float(a) for a in argv[5:10])
    data = np.fromfile(in_path, dtype="<f4")
    if data.size != n * (steps + 1):
        sys.exit(f"adamw_ref.py: {in_path} holds {data.size} floats, expected {n * (steps + 1)}")
    param = torch.nn.Parameter(torch.from_numpy(data[:n].copy()))
    opt = torch.optim.AdamW([param], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
    out = []
    for s in range(steps):
        param.grad = torch.from_numpy(data[n * (s + 1): n * (s + 2)].copy())
        opt.step()
        st = opt.state[param]
        out += [param.detach().numpy().copy(), st["exp_avg"].numpy().copy(), st["exp_avg_sq"].numpy().copy()]
    np.concatenate(out).astype("<f4").tofile(out_path)


if __name__ == "__main__":
    main(sys.argv)
