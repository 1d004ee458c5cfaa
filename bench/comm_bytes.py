#!/usr/bin/env python3
"""Per-step communication of one training step, counted by the flight recorder vs the analytic formulas.

usage: comm_bytes.py --driver PATH/comm_bytes_driver --np {2,4} [--markdown]

Runs `mpiexec -np N comm_bytes_driver` at every layout that fits N ranks (TP=N with and without sequence
parallelism, DP=N with plain DDP and the distributed optimizer, and at N=4 TP2 x DP2 + SP + distopt),
sums the recorder's entries of the second step per (group, op) and requires calls, elements and bytes to
EQUAL the formulas below (no tolerance: every small term is derived, not absorbed). Exit 1 on any
difference (each printed), 2 when the driver fails. --markdown prints the docs/PERF.md tables.

Conventions. Elements are the recorder's `count`: what this rank contributes (an all-gather of
[s/t, b, h] counts s*b*h/t; a reduce-scatter of [s, b, h] counts s*b*h). fp32, 4 bytes. The model is
GPT-2 style (LayerNorm with bias, biased linears, learned positions, tied output layer), L layers,
hidden h, ffn f, padded vocab V, positions Pmax, sequence s, micro-batch b, TP size t, DP size d.

Formulas, per step (one microbatch), per rank:
  local parameters  P = V/t*h + Pmax*h + L*(4h + (3h/t)*h + 3h/t + h*(h/t) + h + (f/t)*h + f/t + h*(f/t) + h) + 2h
  group "tp" (t > 1), without SP, all_reduce (4L + 5 calls):
     forward : 2L * s*b*h    (attention proj + MLP fc2, RowParallel reduce_from_tp)
               + s*b*h       (VocabParallelEmbedding reduce_from_tp)
     backward: 2L * s*b*h    (qkv + fc1 input grads, ColumnParallel copy_to_tp backward)
               + s*b*h       (tied output layer's input grad, ColumnParallel copy_to_tp backward)
     loss    : 3 * s*b       (vocab-parallel cross entropy: max, sum-exp, target logit)
  group "tp" (t > 1), with SP: the layer all-reduces become all-gather + reduce-scatter pairs:
     all_gather    (4L + 2 calls) : (4L + 2) * s*b*h/t   (qkv/fc1 inputs fwd, proj/fc2 output grads bwd,
                                                          output layer input fwd, embedding grad bwd)
     reduce_scatter(4L + 1 calls) : (4L + 1) * s*b*h     (proj/fc2 outputs fwd, qkv/fc1 input grads bwd,
                                                          output layer input grad bwd)
     all_reduce    (4L + 6 calls) : s*b*h (embedding: all-reduce then split, not a reduce-scatter)
                                    + 3*s*b (cross entropy)
                                    + (4L + 2)*h (finalize_model_grads: grads of the SP-duplicated
                                      LayerNorm weights and biases, 2 per norm, 2L + 1 norms)
  group "mp" (t > 1): all_reduce 1 element, 1 call (grad norm of the TP-sharded model)
  group "dp_cp" (always, even at d = 1: a size-1 group is still recorded, it moves nothing):
     plain DDP     : all_reduce P (one bucket), 1 call
     distributed   : reduce_scatter Pp and all_gather Pp/d (Pp = P rounded up to a multiple of d),
                     + all_reduce 1 element when d > 1 (grad norm over the shards)
  group "dp" (d > 1): all_reduce 1 element (Trainer::dp_mean of the loss)
Ring bytes sent per rank (reported, not checked): all_reduce 2(g-1)/g * n, all_gather (g-1) * count,
reduce_scatter (g-1)/g * count, times 4 bytes, g the group size.
"""
import argparse
import json
import math
import os
import subprocess
import sys

FP32 = 4


def local_params(c):
    t, h, f, L = c["tp"], c["hidden"], c["ffn"], c["layers"]
    layer = 4 * h + (3 * h // t) * h + 3 * h // t + h * (h // t) + h + (f // t) * h + f // t + h * (f // t) + h
    return c["padded_vocab"] // t * h + c["max_pos"] * h + c["layers"] * layer + 2 * h


def expected(c):
    """{group: {op: (calls, elements, [(term, elements), ...])}} for the layout of driver output c."""
    t, d, L, h = c["tp"], c["dp"], c["layers"], c["hidden"]
    sbh, sb = c["seq"] * c["micro_batch"] * h, c["seq"] * c["micro_batch"]
    P = local_params(c)
    exp = {}

    def add(group, op, calls, terms):
        exp.setdefault(group, {})[op] = (calls, sum(n for _, n in terms), terms)

    if t > 1:
        if not c["sp"]:
            add("tp", "all_reduce", 4 * L + 5,
                [("fwd proj+fc2 2L*sbh", 2 * L * sbh), ("fwd embedding sbh", sbh),
                 ("bwd qkv+fc1 2L*sbh", 2 * L * sbh), ("bwd output layer sbh", sbh), ("CE 3*sb", 3 * sb)])
        else:
            add("tp", "all_gather", 4 * L + 2, [("(4L+2)*sbh/t", (4 * L + 2) * sbh // t)])
            add("tp", "reduce_scatter", 4 * L + 1, [("(4L+1)*sbh", (4 * L + 1) * sbh)])
            add("tp", "all_reduce", 4 * L + 6,
                [("embedding sbh", sbh), ("CE 3*sb", 3 * sb), ("SP norm grads (4L+2)*h", (4 * L + 2) * h)])
        add("mp", "all_reduce", 1, [("grad norm", 1)])
    if c["distopt"]:
        Pp = math.ceil(P / d) * d
        add("dp_cp", "reduce_scatter", 1, [("grads Pp", Pp)])
        add("dp_cp", "all_gather", 1, [("params Pp/d", Pp // d)])
        if d > 1:
            add("dp_cp", "all_reduce", 1, [("grad norm", 1)])
    else:
        add("dp_cp", "all_reduce", 1, [("grads P", P)])
    if d > 1:
        add("dp", "all_reduce", 1, [("loss mean", 1)])
    return exp, P


def ring_bytes(op, elements, g):
    if op == "all_reduce":
        return 2 * (g - 1) / g * elements * FP32
    if op == "all_gather":
        return (g - 1) * elements * FP32
    return (g - 1) / g * elements * FP32


def group_size(c, group):
    return {"tp": c["tp"], "mp": c["tp"], "dp_cp": c["dp"], "dp": c["dp"]}[group]


def layouts(np_):
    out = [(f"TP{np_}", ["--tp", str(np_)]), (f"TP{np_}+SP", ["--tp", str(np_), "--sp"]),
           (f"DP{np_}", ["--tp", "1"]), (f"DP{np_} distopt", ["--tp", "1", "--distopt"])]
    if np_ == 4:
        out.append(("TP2xDP2+SP distopt", ["--tp", "2", "--sp", "--distopt"]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--np", type=int, required=True, choices=[2, 4])
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    failures, rows = [], []
    for name, flags in layouts(a.np):
        cmd = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "-np", str(a.np), a.driver, *flags]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=100)
        if p.returncode != 0:
            print(f"{name}: driver failed (exit {p.returncode})\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            sys.exit(2)
        c = json.loads(p.stdout.strip().splitlines()[-1])
        exp, P = expected(c)
        if c["local_params"] != P:
            failures.append(f"{name}: local params {c['local_params']} != formula {P}")
        got = c["measured"]
        for g in sorted(set(exp) | set(got)):
            for op in sorted(set(exp.get(g, {})) | set(got.get(g, {}))):
                e = exp.get(g, {}).get(op)
                m = got.get(g, {}).get(op)
                if e is None or m is None or (e[0], e[1], e[1] * FP32) != (m["calls"], m["elements"], m["bytes"]):
                    failures.append(f"{name}: {g}/{op}: measured {m} vs formula {e and (e[0], e[1], e[1] * FP32)}")
                    continue
                rows.append((name, g, op, m["calls"], m["bytes"], e[1] * FP32,
                             ring_bytes(op, m["elements"], group_size(c, g)), " + ".join(f"{t} = {n}" for t, n in e[2])))
    if a.markdown:
        print("| layout | group | op | calls | recorder bytes | formula bytes | ring bytes sent/rank | terms (elements) |")
        print("|---|---|---|---:|---:|---:|---:|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.0f} | {r[7]} |")
    else:
        for r in rows:
            print(f"{r[0]:<20} {r[1]:<6} {r[2]:<15} calls={r[3]:<3} bytes={r[4]:<7} formula={r[5]:<7} ring={r[6]:.0f}")
    for f in failures:
        print("MISMATCH", f)
    print(f"comm_bytes np={a.np}: {len(rows)} (group, op) sums equal the formulas, {len(failures)} mismatches")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
