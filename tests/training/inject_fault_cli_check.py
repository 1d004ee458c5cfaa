#!/usr/bin/env python3
"""--inject-fault values through the real CLI (`mcpp train`, the tiny GPT of cli_harness: 2 decoder layers, 2
iterations): a malformed value, or a drill that could never fire in the run it is given to, exits 2 at startup with
ONE line "error: ..." naming the problem (no training step, no metrics file written); drills at the edges of the run
(the last layer, the last iteration, the final save, the stage that holds the layer) are accepted and fire.
  malformed      nan-grad without layer=K, an unknown kind, ITER not a number / 0 / missing, an unknown option
  not in the run layer K >= --num-layers; ITER > --train-iters (also sample-based: --train-samples); RANK >= world
                 size; --skip-train; bad-shard without --save or at an iteration that saves nothing; hang /
                 wrong-collective / corrupt-collective on one rank; under PP2 (2 ranks) a layer the rank's stage
                 does not hold (every rank names it, the job exits 2)
  accepted       nan-grad:layer=1,persistent@2 (the re-run names decoder.layers.1), bad-shard@2 (the final save: flipped),
                 slow-data:ms=100@2 (iteration 2 takes >= 4 microbatches x 100 ms); PP2 nan-output:layer=1,persistent@2:1 (the stage of rank 1 holds it: named)
usage: inject_fault_cli_check.py MCPP_BIN WORKDIR
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle", "cli"))
from cli_harness import MCPP, WORK, failures, record_corpus, records, run, tiny_train_flags  # noqa: E402

DATA = record_corpus()
BASE = [*tiny_train_flags(DATA), "--train-iters", "2", "--eval-interval", "2"]  # 2 layers, 2 iterations
PP2 = ["--pipeline-model-parallel-size", "2"]  # 2 ranks: layer 0 on rank 0, layer 1 on rank 1
SAMPLES = ["--train-samples", "16", "--lr-warmup-samples", "8"]  # sample-based: 16 / global batch 8 = 2 iterations

# (name, ranks, extra flags, words the error line must hold)
BAD = [
    ("no layer", None, ["nan-grad@2"], ["nan-grad needs layer=K"]),
    ("unknown kind", None, ["boom@2"], ["unknown kind 'boom'"]),
    ("ITER not a number", None, ["kill@x"], ["ITER must be a non-negative integer, got 'x'"]),
    ("ITER 0", None, ["kill@0"], ["ITER counts from 1"]),
    ("no @ITER", None, ["kill"], ["no @ITER"]),
    ("unknown option", None, ["slow-data:speed=9@2"], ["unknown option 'speed=9' for slow-data"]),
    ("every is for the slow kinds", None, ["nan-grad:layer=0,every@2"], ["unknown option 'every' for nan-grad"]),
    ("layer == num_layers", None, ["nan-grad:layer=2@2"],
     ["nan-grad:layer=2@2", "layer 2 is outside the model's 2 decoder layers"]),
    ("layer far out", None, ["nan-output:layer=40,persistent@1"], ["layer 40 is outside the model's 2 decoder"]),
    ("ITER > train-iters", None, ["kill@3"], ["'kill@3'", "iteration 3 is beyond the run's last iteration, 2"]),
    ("ITER > train-samples' iterations", None, ["slow-data:ms=1@3", *SAMPLES],
     ["iteration 3 is beyond the run's last iteration, 2"]),
    ("RANK >= world", None, ["kill@2:1"], ["rank 1 is outside the world of 1 ranks"]),
    ("skip-train", None, ["kill@1", "--skip-train"], ["--skip-train runs no training iteration"]),
    ("bad-shard without --save", None, ["bad-shard@2", "--no-save"], ["bad-shard corrupts a saved checkpoint"]),
    ("bad-shard, no save at ITER", None, ["bad-shard@1"], ["no checkpoint is saved at iteration 1"]),
    ("hang on one rank", None, ["hang@1"], ["hang needs at least 2 ranks"]),
    ("wrong-collective on one rank", None, ["wrong-collective:extra@1"], ["wrong-collective needs at least 2"]),
    ("corrupt-collective on one rank", None, ["corrupt-collective@1"], ["corrupt-collective needs at least 2"]),
    ("PP2: layer not on the rank's stage", 2, ["nan-grad:layer=1@2:0", *PP2],
     ["rank 0's pipeline stage does not hold decoder layer 1", "@2:1"]),
]


def train(name, np_, extra):
    """`mcpp train BASE --inject-fault SPEC [flags] --save WORK/name` (np_ ranks, None: one process); the first
    item of extra is the spec, the rest flags ("--no-save": no --save). Returns (process, save dir)."""
    d = os.path.join(WORK, name.replace(" ", "_").replace("/", "_"))
    flags = [f for f in extra[1:] if f != "--no-save"]
    save = [] if "--no-save" in extra else ["--save", d]
    base = BASE
    if "--train-samples" in flags:  # sample-based: no iteration counts in the flags
        base = [a for i, a in enumerate(BASE) if not (a in ("--train-iters", "--lr-warmup-iters") or
                                                      BASE[i - 1] in ("--train-iters", "--lr-warmup-iters"))]
    return run([MCPP, "train", *base, "--inject-fault", extra[0], *flags, *save], np_=np_, expect=None,
               timeout=120), d


for name, np_, extra, words in BAD:
    p, d = train(name, np_, extra)
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    want_errs = np_ or 1  # one line per rank: under mpiexec each rank names the same problem
    ok = (p.returncode == 2 and 1 <= len(errs) <= want_errs and all(w in e for e in errs for w in words)
          and not os.path.exists(os.path.join(d, "metrics.jsonl")) and "iteration " not in p.stdout)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {p.returncode}: {errs}")
    if not ok:
        failures.append(f"{name}: exit {p.returncode}, error lines {errs}, expected exit 2 and one line (per rank) "
                        f"with {words}\n{p.stdout[-800:]}\n{p.stderr[-1500:]}")

# accepted at the run's edges, and they fire
GOOD = [
    ("last layer, last iteration", None, ["nan-grad:layer=1,persistent@2"], "decoder.layers.1.mlp"),
    ("final save", None, ["bad-shard@2"], "flipped a byte of"),
    ("PP2: the stage that holds the layer", 2, ["nan-output:layer=1,persistent@2:1", *PP2], "decoder.layers.1.mlp"),
]
for name, np_, extra, word in GOOD:
    p, _ = train(name, np_, extra)
    ok = p.returncode == 0 and word in p.stdout + p.stderr
    print(f"{'ok  ' if ok else 'FAIL'} {name}: exit {p.returncode}")
    if not ok:
        failures.append(f"{name}: exit {p.returncode}, expected 0 and {word!r} in the log\n{p.stdout[-1500:]}\n"
                        f"{p.stderr[-1500:]}")

# slow-data at the last iteration: its 4 microbatches (global batch 8 / micro batch 2) each wait 100 ms
p, d = train("slow data, last iteration", None, ["slow-data:ms=100@2"])
ms = {r["iteration"]: r["elapsed_ms_per_iter"] for r in records(d, "train")}
ok = p.returncode == 0 and ms.get(2, 0) >= 4 * 100
print(f"{'ok  ' if ok else 'FAIL'} slow data, last iteration: exit {p.returncode}, ms per iteration {ms}")
if not ok:
    failures.append(f"slow-data:ms=100@2: exit {p.returncode}, iteration 2 took {ms.get(2)} ms, expected >= 400")

# slow-rank every iteration from 1 (the regression gate's steady slowdown): both iterations wait 150 ms
p, d = train("slow rank, every iteration", None, ["slow-rank:ms=150,every@1"])
ms = {r["iteration"]: r["elapsed_ms_per_iter"] for r in records(d, "train")}
ok = p.returncode == 0 and ms.get(1, 0) >= 150 and ms.get(2, 0) >= 150
print(f"{'ok  ' if ok else 'FAIL'} slow rank, every iteration: exit {p.returncode}, ms per iteration {ms}")
if not ok:
    failures.append(f"slow-rank:ms=150,every@1: exit {p.returncode}, ms per iteration {ms}, expected >= 150 each")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
