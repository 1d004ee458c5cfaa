#!/usr/bin/env python3
"""Oracle for mcpp::Adam: torch.optim.AdamW (float32, two param groups: with and without weight decay).

usage: adamw_oracle.py DIR
DIR/meta.json: {"params": [{"name", "numel", "no_weight_decay"}], "lrs": [lr per step],
                "beta1", "beta2", "eps", "weight_decay"}
DIR/p_<i>.bin: initial param i (float32); DIR/g_<step>_<i>.bin: grad of param i at step (0-based).
Writes DIR/out_p_<i>.bin, out_m_<i>.bin, out_v_<i>.bin (float32) after len(lrs) steps.
"""
import json
import os
import sys

import numpy as np
import torch


def main():
    d = sys.argv[1]
    meta = json.load(open(os.path.join(d, "meta.json")))
    params = []
    for i, p in enumerate(meta["params"]):
        x = np.fromfile(os.path.join(d, f"p_{i}.bin"), dtype=np.float32)
        assert x.size == p["numel"], (p["name"], x.size)
        params.append(torch.nn.Parameter(torch.from_numpy(x.copy())))
    decay = [t for t, p in zip(params, meta["params"]) if not p["no_weight_decay"]]
    no_decay = [t for t, p in zip(params, meta["params"]) if p["no_weight_decay"]]
    groups = [{"params": decay, "weight_decay": meta["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=meta["lrs"][0],
                            betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"], foreach=False)
    for step, lr in enumerate(meta["lrs"]):
        for g in opt.param_groups:
            g["lr"] = lr
        for i, t in enumerate(params):
            t.grad = torch.from_numpy(np.fromfile(os.path.join(d, f"g_{step}_{i}.bin"), dtype=np.float32).copy())
        opt.step()
    for i, t in enumerate(params):
        st = opt.state[t]
        t.detach().numpy().astype(np.float32).tofile(os.path.join(d, f"out_p_{i}.bin"))
        st["exp_avg"].numpy().astype(np.float32).tofile(os.path.join(d, f"out_m_{i}.bin"))
        st["exp_avg_sq"].numpy().astype(np.float32).tofile(os.path.join(d, f"out_v_{i}.bin"))


if __name__ == "__main__":
    main()
