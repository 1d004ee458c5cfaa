#!/bin/bash
# Pipeline bubble on GPUs in device time (kind nvidia-h200-x4): GPT-2 124M shapes (12 layers, T 1024, bf16,
# random tokens), 8 microbatches of 4 (global batch 32), `--timeline` — on the CUDA backend its intervals
# are compute-stream device time (training/timeline.h), so the measured bubble is the GPU's idle and
# P2P-wait share of each step. Layouts, each against ONE GPU with the same microbatches in the same call:
#   PP2 1F1B (theory (pp-1)/(M+pp-1) = 1/9), PP4 1F1B (3/11), PP4 interleaved with 3 chunks per stage
#   (1 layer each; (pp-1)/(V*M+pp-1) = 3/27) — even layer splits, so the last stage also carries the LM
#   head and loss over the 50,304-token vocabulary (~4.5 layers of work at 124M) — and the same three with
#   Megatron layout strings that give the last stage fewer layers: PP2 "Et*8|t*4L", PP4 "Et*4|t*4|t*4|L",
#   PP4 x 2 chunks "Et*2|t*2|t*2||t*2|t*2|t*2|L".
# 20 iterations logged every 10: tokens/s of the second window; the bubble report averages steps 2-20 (the
# first is warm-up: plans, GEMM autotuning, NCCL connections).
# usage (device machine, repo root, device_carry/ carried): bench/gpu/pp_bubble_gpu.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_124m
RUN_FLAGS="$M124 --micro-batch-size 4 --global-batch-size 32"
PP2="--pipeline-model-parallel-size 2" PP4="--pipeline-model-parallel-size 4" LAYOUT="--pipeline-model-parallel-layout"
run_train gpu1_m8 1
run_train pp2_m8 2 $PP2 --timeline "$OUT/pp2_m8.json"
run_train pp4_m8 4 $PP4 --timeline "$OUT/pp4_m8.json"
run_train pp4_m8_v3 4 $PP4 --num-layers-per-virtual-pipeline-stage 1 --timeline "$OUT/pp4_m8_v3.json"
run_train pp2_m8_bal 2 $PP2 $LAYOUT "Et*8|t*4L" --timeline "$OUT/pp2_m8_bal.json"
run_train pp4_m8_bal 4 $PP4 $LAYOUT "Et*4|t*4|t*4|L" --timeline "$OUT/pp4_m8_bal.json"
run_train pp4_m8_v2_bal 4 $PP4 $LAYOUT "Et*2|t*2|t*2||t*2|t*2|t*2|L" --timeline "$OUT/pp4_m8_v2_bal.json"
for n in pp2_m8 pp4_m8 pp4_m8_v3 pp2_m8_bal pp4_m8_bal pp4_m8_v2_bal; do
  echo "== $n"; "$MCPP" trace summarize "$OUT/$n.json" --skip-steps 1
done
python3 - "$OUT" <<'PY'
import sys
sys.path.insert(0, "bench/gpu")
from run_metrics import records
out = sys.argv[1]
def recs(n):
    return records(out, n)
base = [r for r in recs("gpu1_m8") if "tokens_per_sec" in r]
print("| layout | tok/s | ms/iter | vs one GPU | bubble per stage (device time) | theory |")
print("| --- | --- | --- | --- | --- | --- |")
for n in ["gpu1_m8", "pp2_m8", "pp4_m8", "pp4_m8_v3", "pp2_m8_bal", "pp4_m8_bal", "pp4_m8_v2_bal"]:
    rs = recs(n)
    it = [r for r in rs if "tokens_per_sec" in r]
    if not it:
        print(f"| {n} | no result | | | | |"); continue
    b = [r for r in rs if r.get("event") == "pipeline_bubble"]
    stages = " / ".join(f"{s['measured']:.3f}" for s in b[-1]["stages"]) if b else ""
    theory = f"{b[-1]['theoretical']:.3f} ({b[-1]['clock']})" if b else ""
    ratio = f"{it[-1]['tokens_per_sec'] / base[-1]['tokens_per_sec']:.2f}x" if base else ""
    tok, ms = it[-1]["tokens_per_sec"], it[-1]["elapsed_ms_per_iter"]
    print(f"| {n} | {tok:,.0f} | {ms:.1f} | {ratio} | {stages} | {theory} |")
PY
