#!/bin/bash
# --tp-comm-overlap (the SP all-gathers feeding GEMMs and RowParallel's GEMM + reduce-scatter as P2P rings
# with the GEMM per chunk) against the plain SP collectives, TP2 + sequence parallel on 2 GPUs (kind
# nvidia-h200-x2): GPT-2 124M shapes (B32 x T1024) and GPT 1.3B shapes (d2048, L24, h16, B8 x T2048), bf16,
# random tokens; each pair run twice in alternating order (off, on, on, off) so a drift in the GPU's clocks
# does not favour one. 20 iterations logged every 10: ms/iter of the second window.
# usage (device machine, repo root, device_carry/ carried): bench/gpu/tp_overlap.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_124m
TP="--tensor-model-parallel-size 2 --sequence-parallel"
RUN_FLAGS="$M124 --micro-batch-size 32 --global-batch-size 32 $TP"
run_train m124_off_a 2
run_train m124_on_a 2 --tp-comm-overlap
run_train m124_on_b 2 --tp-comm-overlap
run_train m124_off_b 2
M13="--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048"
RUN_FLAGS="$M124 $M13 --micro-batch-size 8 --global-batch-size 8 $TP"  # the later flags override M124's
run_train m13_off_a 2
run_train m13_on_a 2 --tp-comm-overlap
run_train m13_on_b 2 --tp-comm-overlap
run_train m13_off_b 2
python3 - "$OUT" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from run_metrics import last_iteration
out = sys.argv[1]
def ms(n):
    r = last_iteration(out, n)
    return r["elapsed_ms_per_iter"] if r else None
print("| model | plain SP collectives (ms/iter, 2 runs) | --tp-comm-overlap (2 runs) | change |")
print("| --- | --- | --- | --- |")
for m in ("m124", "m13"):
    off = [ms(f"{m}_off_{x}") for x in "ab"]
    on = [ms(f"{m}_on_{x}") for x in "ab"]
    if None in off + on:
        print(f"| {m} | {off} | {on} | incomplete |"); continue
    a, b = sum(off) / 2, sum(on) / 2
    print(f"| {m} | {off[0]:.1f} / {off[1]:.1f} | {on[0]:.1f} / {on[1]:.1f} | {100 * (b - a) / a:+.1f}% |")
PY
