#!/usr/bin/env python3
"""Independent Python statement of Megatron-Core's OptimizerParamScheduler.get_lr
(megatron/core/optimizer_param_scheduler.py), the oracle for mcpp's lr_scheduler.

usage: megatron_lr.py IN.json OUT.json
IN: [{"max_lr", "min_lr", "init_lr", "warmup_steps", "decay_steps", "style",
      "wsd_decay_steps", "wsd_style", "steps": [n, ...]}, ...]
OUT: [[lr at each n], ...]
"""
import json
import math
import sys


def get_lr(c, n):
    max_lr, min_lr, init_lr = c["max_lr"], c["min_lr"], c["init_lr"]
    warmup, decay, style = c["warmup_steps"], c["decay_steps"], c["style"]
    if warmup > 0 and n <= warmup:
        return init_lr + (max_lr - init_lr) * float(n) / float(warmup)
    if style == "constant":
        return max_lr
    if n > decay:
        return min_lr
    if style == "inverse-square-root":
        w = max(warmup, 1)
        s = max(n, 1)
        return max(min_lr, max_lr * w ** 0.5 / (s ** 0.5))
    ratio = float(n - warmup) / float(decay - warmup)
    assert 0.0 <= ratio <= 1.0
    delta = max_lr - min_lr
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    elif style == "WSD":
        start = decay - c["wsd_decay_steps"]
        if n <= start:
            coeff = 1.0
        else:
            q = float(n - start) / float(c["wsd_decay_steps"])
            ws = c["wsd_style"]
            if ws == "linear":
                coeff = 1.0 - q
            elif ws == "cosine":
                coeff = 0.5 * (math.cos(math.pi * q) + 1.0)
            elif ws == "exponential":
                coeff = (2.0 * math.pow(0.5, q)) - 1.0
            elif ws == "minus_sqrt":
                coeff = 1.0 - math.sqrt(q)
            else:
                raise ValueError(ws)
    else:
        raise ValueError(style)
    return min_lr + coeff * delta


def main():
    cases = json.load(open(sys.argv[1]))
    json.dump([[get_lr(c, n) for n in c["steps"]] for c in cases], open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
