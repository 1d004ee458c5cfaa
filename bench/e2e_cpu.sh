#!/usr/bin/env bash
# End-to-end CPU training step: `mcpp train` on the demo model (configs/demo.toml) vs the same GPT in PyTorch
# (bench/torch_cpu_gpt.py), interleaved in one run so both see the same machine load.
#
# One step = forward + backward + grad clip + AdamW on micro batch 8 x seq 128 (1024 tokens), fp32, T threads.
# Ours: per-iteration "elapsed_ms_per_iter" from the metrics JSONL (--log-interval 1, evaluation off), the first
# WARMUP iterations dropped. Torch: the step time printed by torch_cpu_gpt.py. Each of ROUNDS rounds runs ours,
# then torch; the figure of merit is the min over all timed steps of each (the machine is shared: the min is the
# least-disturbed step), the median is printed next to it.
#
# Usage: bench/e2e_cpu.sh [MCPP_BIN] ; env: ROUNDS (2) STEPS (6) WARMUP (2) THREADS (2) PYTHON (/usr/bin/python3)
#        DATA (data/fortunes_text_document, built by scripts/prepare_corpus.sh when missing)
# Output: one JSON line per implementation and round, then a summary table with the ratio
# ours/torch (step time; < 1 means we are faster).
set -euo pipefail
cd "$(dirname "$0")/.."
MCPP=${1:-build/bin/mcpp}
ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-6} WARMUP=${WARMUP:-2} THREADS=${THREADS:-2}
PYTHON=${PYTHON:-/usr/bin/python3} DATA=${DATA:-data/fortunes_text_document}
[[ -x $MCPP ]] || { echo "error: $MCPP is not an executable (build first: make build)" >&2; exit 2; }
[[ -f $DATA.idx ]] || bash scripts/prepare_corpus.sh >&2
export OMP_NUM_THREADS=$THREADS
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=$tmp/results.jsonl

for round in $(seq 1 "$ROUNDS"); do
  iters=$((WARMUP + STEPS))
  "$MCPP" train --config configs/demo.toml --data-path "$DATA" --train-iters "$iters" --lr-warmup-iters 1 \
    --log-interval 1 --eval-interval 1000000 --eval-iters 0 --metrics-path "$tmp/m$round.jsonl" > "$tmp/log$round" 2>&1 ||
    { cat "$tmp/log$round" >&2; exit 1; }
  "$PYTHON" - "$tmp/m$round.jsonl" "$WARMUP" "$THREADS" >> "$results" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "train"]
ms = [r["elapsed_ms_per_iter"] for r in rows[int(sys.argv[2]):]]
print(json.dumps({"impl": "mcpp", "threads": int(sys.argv[3]), "steps": len(ms), "step_ms_min": min(ms),
                  "step_ms_median": statistics.median(ms), "tokens_per_s": 1024 * 1000.0 / min(ms),
                  "first_loss": rows[0]["lm_loss"], "last_loss": rows[-1]["lm_loss"]}))
PY
  tail -1 "$results"
  "$PYTHON" bench/torch_cpu_gpt.py --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS" | tee -a "$results"
done

"$PYTHON" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def best(impl):
    r = [x for x in rows if x["impl"] == impl]
    return min(x["step_ms_min"] for x in r), statistics.median(x["step_ms_median"] for x in r)
(om, omed), (tm, tmed) = best("mcpp"), best("torch")
print(f"\n{'impl':<8}{'step ms (min)':>15}{'step ms (median)':>18}{'tokens/s (min)':>16}")
for name, m, med in (("mcpp", om, omed), ("torch", tm, tmed)):
    print(f"{name:<8}{m:>15.1f}{med:>18.1f}{1024 * 1000.0 / m:>16.0f}")
print(f"ratio mcpp/torch step time: {om / tm:.2f} (min), {omed / tmed:.2f} (median)")
PY
