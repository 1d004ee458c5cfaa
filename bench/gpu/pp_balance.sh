#!/bin/bash
# PP2 stage balance on 2 GPUs (kind nvidia-h200-x2), GPT-2 124M shapes (12 layers, T 1024, bf16, random
# tokens), 8 microbatches of 4: the even split (6 | 6 layers) leaves the LM head (2 d V = 77 MFLOP per token
# forward, ~4.5 decoder layers' worth at d 768) and the loss on stage 1; --decoder-first-pipeline-num-layers
# 7 / 8 / 9 moves layers to stage 0. Each against one GPU in the same call (ms/iter of iterations 11-20),
# with the device-time bubble report per stage (--timeline).
# usage (device machine, repo root, device_carry/ carried): bench/gpu/pp_balance.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_124m
RUN_FLAGS="$M124 --micro-batch-size 4 --global-batch-size 32"
run_train gpu1_m8 1
run_train pp2_even 2 --pipeline-model-parallel-size 2 --timeline "$OUT/pp2_even.json"
for f in 7 8 9; do
  run_train "pp2_first$f" 2 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers "$f" \
    --timeline "$OUT/pp2_first$f.json"
done
python3 - "$OUT" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from run_metrics import last_iteration, records
out = sys.argv[1]
one = last_iteration(out, "gpu1_m8")
for n in ["gpu1_m8", "pp2_even", "pp2_first7", "pp2_first8", "pp2_first9"]:
    it = last_iteration(out, n)
    if not it:
        print(f"{n:11s} no result"); continue
    bub = records(out, n, "pipeline_bubble")
    stages = " / ".join(f"{s['measured']:.3f}" for s in bub[0]["stages"]) if bub else "-"
    ratio = f"{one['elapsed_ms_per_iter'] / it['elapsed_ms_per_iter']:.2f}x one GPU" if one else ""
    print(f"{n:11s} {it['elapsed_ms_per_iter']:7.1f} ms/iter {it['tokens_per_sec']:>9.0f} tok/s  {ratio:15s}"
          f" bubble per stage {stages}" + (f" (theory {bub[0]['theoretical']:.3f})" if bub else ""))
PY
