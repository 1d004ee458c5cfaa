#!/bin/bash
# The device-time timeline's collectives row (training/timeline.h) on a 2-GPU device machine (kind
# nvidia-h200-x2): `mcpp train --device cuda --bf16 --timeline` under mpirun with NCCL groups, 6 steps.
#   dp2_tl   DP2 with --overlap-grad-reduce and small buckets (--ddp-bucket-size 200000 of a 8-layer d256
#            model: several buckets): per rank and step the same all_reduce calls on the comm stream, and
#            `mcpp trace summarize` shows them overlapping the backward (coll_overlap > 0) — the DDP overlap
#            made visible;
#   pp2_tl   PP2 (1F1B, 8 microbatches): one comm-stream batch_p2p row per p2p row of the schedule, per step;
#   tp2sp_tl TP2 + sequence parallel: all_gather / reduce_scatter rows of the tp group every step.
# Every trace: clock "device", the collectives row named "collectives (comm stream)", non-negative
# durations, each collective between its step's first schedule row and the next step's (+- 1 ms). Exit 1
# on any failure.
# usage (repo root, device_carry/ from bench/gpu/make_carry.sh carried): tests/device/gpu_timeline_check.sh OUT
set -u
OUT=${1:?usage: gpu_timeline_check.sh OUT}
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_small
RUN_FLAGS="--num-layers 8 $SMALL_MODEL --bf16"
run_train dp2_tl 2 --overlap-grad-reduce --ddp-bucket-size 200000 --timeline "$OUT/dp2_tl.json"
run_train pp2_tl 2 --pipeline-model-parallel-size 2 --timeline "$OUT/pp2_tl.json"
run_train tp2sp_tl 2 --tensor-model-parallel-size 2 --sequence-parallel --timeline "$OUT/tp2sp_tl.json"
for n in dp2_tl pp2_tl tp2sp_tl; do
  echo "== $n"; "$MCPP" trace summarize "$OUT/$n.json" --skip-steps 1 > "$OUT/$n.summary" 2>&1; cat "$OUT/$n.summary"
done
PYTHONPATH=tests/device python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
from verdicts import check, passed

def load(name):
    try:
        return json.load(open(f"{out}/{name}.json"))
    except (OSError, ValueError) as e:
        print(f"{name}: no trace ({e})")
        return {"traceEvents": [], "otherData": {}}

traces = {n: load(n) for n in ("dp2_tl", "pp2_tl", "tp2sp_tl")}
for name, tr in traces.items():
    xs = [e for e in tr["traceEvents"] if e.get("ph") == "X"]
    coll = [e for e in xs if e["tid"] == 2]
    check(name, tr["otherData"].get("clock") == "device", "clock device")
    check(name, any(e.get("ph") == "M" and e.get("tid") == 2 and e["args"]["name"] == "collectives (comm stream)"
                    for e in tr["traceEvents"]), "collectives row named")
    check(name, coll and all(e["dur"] >= 0 and e["cat"] == "collective" for e in coll), f"{len(coll)} collectives")
    inside = True  # each step's collectives between its first schedule action and the next step's (+- 1 ms)
    for pid in (0, 1):
        starts = {}
        for e in xs:
            if e["pid"] == pid and e["tid"] in (0, 1):  # the schedule's rows (compute, p2p)
                s = e["args"]["step"]
                starts[s] = min(starts.get(s, e["ts"]), e["ts"])
        for e in coll:
            if e["pid"] != pid:
                continue
            s = e["args"]["step"]
            hi = starts.get(s + 1, float("inf")) + 1000.0
            inside &= s in starts and starts[s] - 1000.0 <= e["ts"] and e["ts"] + e["dur"] <= hi
    check(name, inside, "collectives within their steps")

def names(tr, pid, step):
    return sorted(e["name"] for e in tr["traceEvents"]
                  if e.get("ph") == "X" and e["tid"] == 2 and e["pid"] == pid and e["args"]["step"] == step)

dp = traces["dp2_tl"]
for pid in (0, 1):
    per = [names(dp, pid, s) for s in range(6)]
    check("dp2_tl", all(p == per[1] for p in per[1:]) and per[1].count("all_reduce dp_cp") >= 2,
          f"rank {pid}: the same bucket all-reduces every step: {per[1]}")
summary = open(f"{out}/dp2_tl.summary").read().split("slowest stage:")[0].splitlines()  # the per-rank table
rows = [l.split() for l in summary if l.split()[:1] in (["0"], ["1"])]
check("dp2_tl", len(rows) == 2 and all(float(r[-1]) > 0 for r in rows),
      f"bucket all-reduces overlap the backward (coll_overlap ms {[r[-1] for r in rows]})")
pp = traces["pp2_tl"]
for pid in (0, 1):
    for s in range(6):
        p2p_rows = sum(1 for e in pp["traceEvents"] if e.get("ph") == "X" and e["tid"] == 1 and e["pid"] == pid
                       and e["args"]["step"] == s)
        if names(pp, pid, s).count("batch_p2p pp") != p2p_rows or p2p_rows == 0:
            check("pp2_tl", False, f"rank {pid} step {s}: {names(pp, pid, s)} vs {p2p_rows} p2p rows")
            break
    else:
        check("pp2_tl", True, f"rank {pid}: one comm-stream batch_p2p per p2p row, every step")
tp = traces["tp2sp_tl"]
for pid in (0, 1):
    per = [names(tp, pid, s) for s in range(6)]
    check("tp2sp_tl", all(p == per[0] for p in per) and "all_gather tp" in per[0] and "reduce_scatter tp" in per[0],
          f"rank {pid}: tp all_gather / reduce_scatter every step ({len(per[0])} calls per step)")
print("GPU TIMELINE COLLECTIVES", "OK" if passed() else "FAILED")
sys.exit(0 if passed() else 1)
PY
