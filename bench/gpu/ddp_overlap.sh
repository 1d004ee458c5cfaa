#!/bin/bash
# How much DDP's bucketed gradient all-reduce costs DP2 and how much of it --overlap-grad-reduce hides
# (kind nvidia-h200-x2 or larger; 2 GPUs used): GPT-2 124M shapes (T 1024, bf16, random tokens), micro
# batch 32 per rank (global 64), fp32 main grads all-reduced (0.5 GB per step). Rows, each against ONE GPU
# with micro batch 32 in the same call: DP2 without overlap (all buckets after the backward), DP2 with
# overlap at the default bucket size (40M elements: the buckets of the last layers post mid-backward, the
# first layers' and the embedding's at its end) and at 10M / 4M elements (more buckets, posted earlier).
# The exposed communication per step = DP2 ms/iter - one GPU's (the same work per rank otherwise).
# 20 iterations logged every 10: the second window.
# usage (device machine, repo root, device_carry/ carried): bench/gpu/ddp_overlap.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_124m
RUN_FLAGS="$M124 --micro-batch-size 32"
run_train gpu1 1 --global-batch-size 32
run_train dp2_sync 2 --global-batch-size 64
run_train dp2_overlap 2 --global-batch-size 64 --overlap-grad-reduce
run_train dp2_overlap_b10m 2 --global-batch-size 64 --overlap-grad-reduce --ddp-bucket-size 10000000
run_train dp2_overlap_b4m 2 --global-batch-size 64 --overlap-grad-reduce --ddp-bucket-size 4000000
python3 - "$OUT" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from run_metrics import last_iteration
out = sys.argv[1]
def last(n):
    return last_iteration(out, n)
base = last("gpu1")
print("| layout | tok/s | ms/iter | vs one GPU | exposed comm (ms/iter over one GPU) |")
print("| --- | --- | --- | --- | --- |")
for n in ["gpu1", "dp2_sync", "dp2_overlap", "dp2_overlap_b10m", "dp2_overlap_b4m"]:
    r = last(n)
    if not r:
        print(f"| {n} | no result | | | |"); continue
    ms = r["elapsed_ms_per_iter"]
    extra = " | "
    if base and n != "gpu1":
        extra = f"{r['tokens_per_sec'] / base['tokens_per_sec']:.3f}x | {ms - base['elapsed_ms_per_iter']:.2f}"
    print(f"| {n} | {r['tokens_per_sec']:,.0f} | {ms:.2f} | {extra} |")
PY
