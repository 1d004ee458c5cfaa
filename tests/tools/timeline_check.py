#!/usr/bin/env python3
"""`mcpp train --pipeline-model-parallel-size 2 --timeline T` under mpiexec, then `mcpp trace summarize`.

usage: timeline_check.py MCPP WORKDIR
  1. the trace holds both ranks (pid 0 and 1), and for every training step an F and a B event for every
     microbatch (M = global / micro batch = 4) on each rank, with P2P events on the p2p track;
  2. the metrics JSONL has a pipeline_bubble record with theoretical (pp-1)/(M+pp-1) = 0.2 and a measured
     value in [0, 1) for both stages;
  3. `mcpp trace summarize T` prints a row per rank and the slowest stage; on a malformed file and on a
     missing file it exits 2 with one "error:" line.
"""
import json
import os
import shutil
import subprocess
import sys

MCPP, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
MPI = ["mpiexec", "--allow-run-as-root", "--oversubscribe"]
failures = []


def run(cmd, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)


corpus = os.path.join(WORK, "corpus.jsonl")
with open(corpus, "w") as f:
    for i in range(300):
        f.write(json.dumps({"text": f"Record {i}: alpha beta gamma {i % 11} delta epsilon {i % 5} zeta."}) + "\n")
p = run([MCPP, "data", "preprocess", "--input", corpus, "--output-prefix", os.path.join(WORK, "c"), "--append-eod"])
assert p.returncode == 0, p.stderr
ITERS, M = 3, 4
trace_path, metrics_path = os.path.join(WORK, "trace.json"), os.path.join(WORK, "metrics.jsonl")
args = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", str(2 * M), "--lr", "1e-3",
        "--train-iters", str(ITERS), "--log-interval", "1", "--eval-interval", "2", "--eval-iters", "1",
        "--split", "90,10,0", "--attention-dropout", "0", "--data-path", os.path.join(WORK, "c_text_document"), "--seed", "5",
        "--pipeline-model-parallel-size", "2", "--timeline", trace_path, "--metrics-path", metrics_path]
p = run(MPI + ["-np", "2", MCPP, "train", *args])
if p.returncode != 0:
    failures.append(f"train exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
elif "pipeline bubble" not in p.stdout:
    failures.append(f"no bubble table on stdout:\n{p.stdout[-2000:]}")

if not failures:
    trace = json.load(open(trace_path))
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    if sorted({e["pid"] for e in xs}) != [0, 1]:
        failures.append(f"pids {sorted({e['pid'] for e in xs})}")
    for pid in (0, 1):
        for kind in "FB":
            got = sorted((e["args"]["step"], e["args"]["microbatch"]) for e in xs
                         if e["pid"] == pid and e["name"].startswith(kind) and e["tid"] == 0)
            want = [(s, m) for s in range(ITERS) for m in range(M)]
            if got != want:
                failures.append(f"rank {pid} {kind} events (step, microbatch) {got} != {want}")
        comm = [e for e in xs if e["pid"] == pid and e["cat"] == "p2p"]
        if not comm or any(e["tid"] != 1 for e in comm):
            failures.append(f"rank {pid}: p2p events missing or not on the p2p track")
        # The collectives row (tid 2): each step's batch_p2p calls (one per p2p action) and its all-reduces
        # (tied-embedding grads, grad norm, loss), the same per step, host-timed, inside the training.
        coll = [e for e in xs if e["pid"] == pid and e["tid"] == 2]
        if any(e["cat"] != "collective" or e["dur"] < 0 or e["ts"] < 0 for e in coll):
            failures.append(f"rank {pid}: malformed collective events {coll[:3]}")
        per_step = [sorted(e["name"] for e in coll if e["args"]["step"] == s) for s in range(ITERS)]
        p2p_rows = [sum(1 for e in comm if e["args"]["step"] == s) for s in range(ITERS)]
        if any(ps != per_step[0] for ps in per_step) or \
                [ps.count("batch_p2p pp") for ps in per_step] != p2p_rows or \
                not any(n.startswith("all_reduce ") for n in per_step[0]) or \
                len({(e["name"], e["args"].get("seq", e["args"].get("p2p_seq"))) for e in coll}) != len(coll):
            failures.append(f"rank {pid}: collectives per step {per_step} (p2p rows per step {p2p_rows})")
    if not any(e["ph"] == "M" and e.get("tid") == 2 and e["args"]["name"] == "collectives"
               for e in trace["traceEvents"]):
        failures.append("no thread_name metadata for the collectives row")
    bubbles = [json.loads(l) for l in open(metrics_path) if '"pipeline_bubble"' in l]
    if len(bubbles) != 1 or abs(bubbles[0]["theoretical"] - 1 / 5) > 1e-12 or \
            sorted(s["stage"] for s in bubbles[0]["stages"]) != [0, 1] or \
            any(not 0 <= s["measured"] < 1 for s in bubbles[0]["stages"]) or \
            (bubbles[0]["steps"], bubbles[0]["skipped_steps"], bubbles[0]["clock"]) != (ITERS - 1, 1, "host"):
        failures.append(f"pipeline_bubble record: {bubbles}")
    p = run([MCPP, "trace", "summarize", trace_path])
    if p.returncode != 0 or "slowest stage:" not in p.stdout or "theoretical bubble: 0.2000" not in p.stdout or \
            "intervals: host time" not in p.stdout or "coll_overlap" not in p.stdout or \
            "batch_p2p pp" not in p.stdout.split("collectives per step:")[-1] or \
            len([l for l in p.stdout.split("slowest stage:")[0].splitlines() if l.split()[:1] in (["0"], ["1"])]) != 2:
        failures.append(f"summarize: exit {p.returncode}\n{p.stdout}\n{p.stderr}")

    p = run([MCPP, "trace", "summarize", trace_path, "--skip-steps", "1"])
    if p.returncode != 0 or f"{ITERS - 1} step(s) summarized (the first 1 skipped as warm-up)" not in p.stdout:
        failures.append(f"summarize --skip-steps 1: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    p = run([MCPP, "trace", "summarize", trace_path, "--skip-steps", str(ITERS)])
    if p.returncode != 2 or "leaves nothing" not in p.stderr:
        failures.append(f"summarize --skip-steps {ITERS}: exit {p.returncode}, stderr {p.stderr!r}")

bad = os.path.join(WORK, "bad.json")
open(bad, "w").write('{"traceEvents": [{"ph": "X", "pid": 0}')
for path in (bad, os.path.join(WORK, "missing.json")):
    p = run([MCPP, "trace", "summarize", path])
    lines = p.stderr.strip().splitlines()
    if p.returncode != 2 or len(lines) != 1 or not lines[0].startswith("error:") or path not in lines[0]:
        failures.append(f"summarize {path}: exit {p.returncode}, stderr {p.stderr!r}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("timeline check: OK")
