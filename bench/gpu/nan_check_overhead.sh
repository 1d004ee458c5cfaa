#!/bin/bash
# The healthy-step cost of --check-for-nan-in-loss-and-grad (issue 33's < 1% of a GPT-2 124M step): bench/gpu/env.sh's
# $M124 shapes, bf16, micro batch 32, 60 iterations logged every 10, with the check on (the default) and off
# (--no-check-for-nan-in-loss-and-grad), three runs each, interleaved (on, off, on, ...). Healthy steps run no
# per-module check (training/nan_localizer.h): the difference is an RNG-state copy, a branch per module scope and a
# flight-recorder context per step. Step time: the median of the log line's window means over iterations 21-60.
# Also one drill run, --inject-fault nan-grad:layer=5@30, to show the re-run's report on the GPU.
# Prints one JSON line per configuration and "on_over_off" (< 1.01 passes).
# usage (device machine, repo root, device_carry/ carried): bench/gpu/nan_check_overhead.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
. bench/gpu/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
make_rnd_124m
RUN_FLAGS="$M124 --micro-batch-size 32 --global-batch-size 32 --train-iters 60"
for rep in 1 2 3; do
  run_train "on_$rep" 1
  run_train "off_$rep" 1 --no-check-for-nan-in-loss-and-grad
done
run_train "drill" 1 --inject-fault nan-grad:layer=5@30
python3 - "$OUT" <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench/gpu")
from run_metrics import records
out = sys.argv[1]
med = {}
for cfg in ("on", "off"):
    ms = [r["elapsed_ms_per_iter"] for rep in (1, 2, 3) for r in records(out, f"{cfg}_{rep}", "train")
          if r["iteration"] > 20]
    med[cfg] = statistics.median(ms) if ms else None
    print(json.dumps({"config": cfg, "windows": len(ms), "median_step_ms": med[cfg] and round(med[cfg], 3)}))
print(json.dumps({"on_over_off": round(med["on"] / med["off"], 4) if med["on"] and med["off"] else None}))
print(json.dumps(records(out, "drill", "rerun_incident")))
PY
