#!/bin/bash
# 2-GPU training throughput (kind nvidia-h200-x2), GPT-2 124M shapes (T 1024, bf16, random tokens), each
# layout against ONE GPU in the same call: DP2 (global batch 64 = 2 x 32, so tokens/s should double),
# TP2 + sequence parallel (global batch 32; also with --tp-comm-overlap's ring all-gathers), PP2 with 8
# microbatches of 4 (bubble (pp-1)/(M+pp-1) = 1/9), CP2 (context parallel, all-to-all attention: 512 of the
# 1024 rows and 6 of the 12 heads a GPU; global batch 32).
# 20 iterations logged every 10: tokens/s of the second window. Also prints the pipeline bubble report.
# usage (device machine, repo root, device_carry/ carried): bench/gpu/multi_gpu.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_124m
RUN_FLAGS="$M124"
run_train gpu1_b32 1 --micro-batch-size 32 --global-batch-size 32
run_train dp2_b64 2 --micro-batch-size 32 --global-batch-size 64 --overlap-grad-reduce
TP2SP="--micro-batch-size 32 --global-batch-size 32 --tensor-model-parallel-size 2 --sequence-parallel"
run_train tp2sp_b32 2 $TP2SP
run_train tp2sp_ovl_b32 2 $TP2SP --tp-comm-overlap
run_train cp2_b32 2 --micro-batch-size 32 --global-batch-size 32 --context-parallel-size 2
run_train gpu1_m8 1 --micro-batch-size 4 --global-batch-size 32
run_train pp2_m8 2 --micro-batch-size 4 --global-batch-size 32 --pipeline-model-parallel-size 2 \
  --timeline "$OUT/pp2.json"
grep -A8 'bubble' "$OUT/pp2_m8.log" | head -12
python3 - "$OUT" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from run_metrics import last_iteration, records
out = sys.argv[1]
def last(n):
    it = last_iteration(out, n)
    mem = [r["peak_device_gib"] for r in records(out, n, "memory")]
    return (it["tokens_per_sec"], it["elapsed_ms_per_iter"], mem[-1] if mem else None) if it else None
base = {"dp2_b64": "gpu1_b32", "tp2sp_b32": "gpu1_b32", "tp2sp_ovl_b32": "gpu1_b32", "cp2_b32": "gpu1_b32",
        "pp2_m8": "gpu1_m8"}
for n in ["gpu1_b32", "dp2_b64", "tp2sp_b32", "tp2sp_ovl_b32", "cp2_b32", "gpu1_m8", "pp2_m8"]:
    r = last(n)
    if not r:
        print(f"{n:10s} no result"); continue
    ratio = f" = {r[0] / last(base[n])[0]:.2f}x one GPU" if n in base and last(base[n]) else ""
    print(f"{n:10s} {r[0]:>10.0f} tok/s  {r[1]:8.1f} ms/iter  peak {r[2]} GiB (last rank){ratio}")
PY
