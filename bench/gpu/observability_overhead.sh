#!/bin/bash
# The cost of observability on one GPU (issue 32's < 1% of a step): GPT-2 124M shapes (bench/gpu/env.sh's $M124, bf16,
# micro batch 32), 60 iterations logged every 10, in four configurations run twice each, interleaved (off, on, level2,
# graph-on, off, on, ...) so that clock drift hits them alike:
#   off     the metrics file of the last rank only (--no-per-rank-metrics), --timing-log-level 0, no TensorBoard
#   on      per-rank metrics, --timing-log-level 1 (Megatron's step timers: device events, no synchronization),
#           --tensorboard-dir with --tensorboard-log-interval 1, --log-timers-to-tensorboard and
#           --log-memory-to-tensorboard
#   level2  on + --timing-log-level 2 (per-microbatch forward / backward and batch-generator timers)
#   graph   on, and off, under --enable-cuda-graph (graph-off / graph-on)
# Step time: the median of the log line's window means (elapsed time per iteration) over iterations 21-60 (four
# windows), each configuration's two runs pooled. Prints one JSON line per configuration and the ratios to off
# ("on_over_off": the number docs/PERF.md records; < 1.01 passes).
# usage (device machine, repo root, device_carry/ carried): bench/gpu/observability_overhead.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
. bench/gpu/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
make_rnd_124m
RUN_FLAGS="$M124 --micro-batch-size 32 --global-batch-size 32 --train-iters 60"
OFF="--no-per-rank-metrics --timing-log-level 0"
ON="--timing-log-level 1 --tensorboard-log-interval 1 --log-timers-to-tensorboard --log-memory-to-tensorboard"
GRAPH="--enable-cuda-graph --cuda-graph-warmup-steps 3"
for rep in 1 2; do
  run_train "off_$rep" 1 $OFF
  run_train "on_$rep" 1 $ON --tensorboard-dir "$OUT/tb_on_$rep"
  run_train "level2_$rep" 1 $ON --timing-log-level 2 --tensorboard-dir "$OUT/tb_level2_$rep"
  run_train "graph-off_$rep" 1 $OFF $GRAPH
  run_train "graph-on_$rep" 1 $ON $GRAPH --tensorboard-dir "$OUT/tb_graph_$rep"
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench/gpu")
from run_metrics import records
out = sys.argv[1]
med = {}
for cfg in ("off", "on", "level2", "graph-off", "graph-on"):
    ms = [r["elapsed_ms_per_iter"] for rep in (1, 2) for r in records(out, f"{cfg}_{rep}", "train")
          if r["iteration"] > 20]
    med[cfg] = statistics.median(ms) if ms else None
    print(json.dumps({"config": cfg, "windows": len(ms), "median_step_ms": med[cfg] and round(med[cfg], 3),
                      "mfu": (records(out, f"{cfg}_1", "train") or [{}])[-1].get("mfu")}))
ratio = lambda a, b: round(med[a] / med[b], 4) if med[a] and med[b] else None
print(json.dumps({"on_over_off": ratio("on", "off"), "level2_over_off": ratio("level2", "off"),
                  "graph_on_over_graph_off": ratio("graph-on", "graph-off")}))
PY
