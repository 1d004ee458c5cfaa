#!/usr/bin/env bash
# Tokens/s of `mcpp train` at TP1/2/4 and DP1/2/4 on CPU ranks (mpiexec), with a FIXED global batch.
#
# Model: configs/demo.toml (GPT-2 style, 4 layers, hidden 128, 4 heads, seq 128, GPT-2 vocab padded),
# data data/fortunes_text_document (scripts/prepare_corpus.sh builds it when missing). Global batch 8
# sequences = 1024 tokens per step, one microbatch per DP rank: TP-k runs micro-batch 8 on DP 1, DP-k
# runs micro-batch 8/k on each of k ranks. Threads: OMP_NUM_THREADS = 2 / ranks (at least 1), so one rank
# uses both cores and 2 ranks use one each; 4 ranks on a 2-core machine are OVERSUBSCRIBED (2 ranks per
# core) — that row measures the cost of oversubscription, not scaling.
# Per layout: WARMUP + STEPS iterations, --log-interval 1, evaluation off; the figure is tokens/s of the
# fastest timed step (the machine is shared with other jobs: the min step time is the least disturbed),
# the median next to it. Output: a markdown table on stdout (docs/PERF.md), progress on stderr.
#
# Usage: bench/tp_dp_throughput.sh [MCPP_BIN] ; env: STEPS (4) WARMUP (2) PYTHON (/usr/bin/python3)
#        DATA (data/fortunes_text_document)
set -euo pipefail
cd "$(dirname "$0")/.."
MCPP=${1:-build/bin/mcpp}
STEPS=${STEPS:-4} WARMUP=${WARMUP:-2}
PYTHON=${PYTHON:-/usr/bin/python3} DATA=${DATA:-data/fortunes_text_document}
[[ -x $MCPP ]] || { echo "error: $MCPP is not an executable (build first)" >&2; exit 2; }
[[ -f $DATA.idx ]] || bash scripts/prepare_corpus.sh >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GBS=8 SEQ=128
iters=$((WARMUP + STEPS))

echo "| layout | ranks | threads/rank | micro-batch | tokens/step | step ms (min) | step ms (median) | tokens/s (min step) | final loss |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for layout in tp1 tp2 tp4 dp1 dp2 dp4; do
  kind=${layout:0:2} n=${layout:2}
  if [[ $kind == tp ]]; then
    flags=(--tensor-model-parallel-size "$n" --micro-batch-size "$GBS")
  else
    flags=(--micro-batch-size $((GBS / n)))
  fi
  threads=$((2 / n)); ((threads >= 1)) || threads=1
  echo "running $layout (np $n, $threads threads/rank)" >&2
  OMP_NUM_THREADS=$threads mpiexec --allow-run-as-root --oversubscribe -np "$n" -x OMP_NUM_THREADS \
    "$MCPP" train --config configs/demo.toml --data-path "$DATA" "${flags[@]}" --global-batch-size "$GBS" \
    --train-iters "$iters" --lr-warmup-iters 1 --log-interval 1 --eval-interval 1000000 --eval-iters 0 \
    --metrics-path "$tmp/$layout.jsonl" > "$tmp/$layout.log" 2>&1 || { cat "$tmp/$layout.log" >&2; exit 1; }
  "$PYTHON" - "$tmp/$layout.jsonl" "$WARMUP" "$layout" "$n" "$threads" "$GBS" "$SEQ" <<'PY'
import json, statistics, sys
path, warm, layout, n, threads, gbs, seq = sys.argv[1], int(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:])
rows = [r for r in map(json.loads, open(path)) if r.get("event") == "train"]
ms = [r["elapsed_ms_per_iter"] for r in rows[warm:]]
micro = gbs if layout.startswith("tp") else gbs // n
tok = gbs * seq
name = layout.upper() + (" (oversubscribed 2x)" if n > 2 else "")
print(f"| {name} | {n} | {threads} | {micro} | {tok} | {min(ms):.1f} | {statistics.median(ms):.1f} | "
      f"{tok * 1000.0 / min(ms):.0f} | {rows[-1]['lm_loss']:.4f} |")
PY
done
