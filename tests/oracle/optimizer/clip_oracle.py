#!/usr/bin/env python3
"""Oracle for mcpp::clip_grad_norm_fp32: torch.nn.utils.clip_grad_norm_ (L2) plus a float64 norm.

usage: clip_oracle.py DIR
DIR/meta.json: {"numels": [...], "max_norm": x}; DIR/g_<i>.bin: float32 grads.
Writes DIR/out.json {"torch_norm": float32 norm from torch, "norm64": float64 norm of the same values}
and DIR/out_g_<i>.bin: the grads after torch's clipping (float32).
"""
import json
import os
import sys

import numpy as np
import torch


def main():
    d = sys.argv[1]
    meta = json.load(open(os.path.join(d, "meta.json")))
    ps = []
    for i, n in enumerate(meta["numels"]):
        g = np.fromfile(os.path.join(d, f"g_{i}.bin"), dtype=np.float32)
        assert g.size == n
        p = torch.nn.Parameter(torch.zeros(n, dtype=torch.float32))
        p.grad = torch.from_numpy(g.copy())
        ps.append(p)
    norm64 = float(np.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in ps)))
    torch_norm = float(torch.nn.utils.clip_grad_norm_(ps, meta["max_norm"], norm_type=2.0))
    for i, p in enumerate(ps):
        p.grad.numpy().astype(np.float32).tofile(os.path.join(d, f"out_g_{i}.bin"))
    json.dump({"torch_norm": torch_norm, "norm64": norm64}, open(os.path.join(d, "out.json"), "w"))


if __name__ == "__main__":
    main()
