#!/usr/bin/env python3
"""Kill tests of the sharded save and of retention (issues 5, 38): SIGKILL at 25 named points, sync and async.

usage: dcp_kill_check.py MCPP WORKDIR
A DP2 run (distributed optimizer: each rank writes its own optimizer pieces and its share of the replicated model
tensors) on 2 ranks with --keep-last-n-checkpoints 1 has committed iteration 2 (the uninterrupted reference run goes
on to 6, saving every 2). A resumed run saves iteration 4 and is SIGKILLed at one
point (MCPP_FAULT_KILL_AT=<point>, MCPP_FAULT_KILL_ITERATION=4; MCPP_FAULT_KILL_RANK=<r> for one rank, unset for all):
the 14 points every rank passes (killed on all ranks, and on rank 1 alone for four of them), rank 0's 8 commit points
and its 3 retention points (deleting iter_0000002 after committing 4). Every point runs with a sync save and with
--async-save. After each kill:
  - the run failed; latest_checkpointed_iteration.txt is 2 or 4, exactly what the point implies where that is
    deterministic (2 before the vote or before the tracker rename, 4 after it);
  - iter_0000004 does not exist before rank 0 renamed the staging directory; no half-deleted iter_N is visible
    (every iter_N directory holds a manifest and verifies); staging / set-aside directories are refused by verify;
  - `mcpp ckpt verify` passes on the tracker's checkpoint;
  - the next start (a resumed 2-rank run for two more iterations, to 4 or 6) loads it and trains them with exactly
    the reference run's lm loss and grad norm (bit for bit), and afterwards the save directory holds committed
    checkpoints only (no *.tmp-*, *.superseded-*, *.deleting-*; --keep-last-n-checkpoints 1 leaves the last one).
(The TP2 x DP2 layout's save and load are the kill-free tests' subject: dcp.reshard_matrix, dcp.corruption.)
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
MPI = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
failures = []


def run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, env=env or ENV, timeout=300)


corpus = os.path.join(WORK, "corpus.jsonl")
with open(corpus, "w") as f:
    for i in range(200):
        f.write(json.dumps({"text": f"Record {i}: alpha beta gamma {i % 11} delta {i % 5}."}) + "\n")
run([MCPP, "data", "preprocess", "--input", corpus, "--output-prefix", os.path.join(WORK, "c"), "--append-eod"])
M = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
     "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
     "--lr-decay-iters", "8", "--log-interval", "1", "--eval-interval", "100", "--eval-iters", "1",
     "--split", "90,10,0", "--hidden-dropout", "0", "--attention-dropout", "0",
     "--data-path", os.path.join(WORK, "c_text_document"), "--seed", "5",
     "--make-vocab-size-divisible-by", "64", "--use-distributed-optimizer", "--save-interval", "2",
     "--keep-last-n-checkpoints", "1"]


def train_records(metrics):
    if not os.path.exists(metrics):
        return {}
    return {r["iteration"]: (r["lm_loss"], r["grad_norm"]) for r in map(json.loads, open(metrics))
            if r.get("event") == "train"}


ref_dir = os.path.join(WORK, "reference")
p = run(MPI + [MCPP, "train", *M, "--train-iters", "6", "--save", ref_dir, "--metrics-path",
               os.path.join(WORK, "reference.jsonl")])
reference = train_records(os.path.join(WORK, "reference.jsonl"))
base = os.path.join(WORK, "base")
q = run(MPI + [MCPP, "train", *M, "--train-iters", "2", "--save", base])
if p.returncode != 0 or q.returncode != 0 or sorted(reference) != [1, 2, 3, 4, 5, 6]:
    print("FAIL: reference / base run\n" + p.stderr[-3000:] + q.stderr[-3000:])
    sys.exit(1)

ALL_RANKS = ["save_start", "after_uuid", "before_write_model", "mid_file", "after_fsync_model",
             "before_write_optimizer", "after_fsync_optimizer", "after_dir_fsync", "before_vote", "after_vote",
             "before_gather_manifest", "after_gather_manifest", "before_final_broadcast", "save_end"]
ONE_RANK = ["mid_file", "after_fsync_optimizer", "before_vote", "after_gather_manifest"]  # rank 1 alone
RANK0 = ["before_manifest_write", "between_manifest_write_and_rename", "after_manifest_rename",
         "before_dir_rename", "after_dir_rename", "after_parent_fsync", "during_latest_update",
         "after_latest_update"]
RETENTION = ["retention_after_rename", "retention_mid_delete", "retention_after_delete"]  # rank 0, after commit 4
BEFORE_VOTE = set(ALL_RANKS[:ALL_RANKS.index("after_vote")])  # no rank can have committed
NO_DIR = set(RANK0[:RANK0.index("after_dir_rename")])  # rank 0 died before renaming the directory
TRACKER_2 = NO_DIR | {"after_dir_rename", "after_parent_fsync", "during_latest_update"}
TRACKER_4 = {"after_latest_update", "save_end"} | set(RETENTION)
LEFTOVER = (".tmp-", ".superseded-", ".deleting-")


def latest(d):
    return open(os.path.join(d, "latest_checkpointed_iteration.txt")).read().strip()


def verify(path):
    return run([MCPP, "ckpt", "verify", "--load", path])


cases = [(pt, "all") for pt in ALL_RANKS] + [(pt, "1") for pt in ONE_RANK] + [(pt, "0") for pt in RANK0 + RETENTION]
cases = [(pt, who, mode) for mode in ("sync", "async") for pt, who in cases]
for pt, who, mode in cases:
    tag = f"{pt} ({'all ranks' if who == 'all' else 'rank ' + who}, {mode})"
    d = os.path.join(WORK, f"k_{mode}_{pt}_{who}")
    shutil.copytree(base, d)
    env = {**ENV, "MCPP_FAULT_KILL_AT": pt, "MCPP_FAULT_KILL_ITERATION": "4"}
    if who != "all":
        env["MCPP_FAULT_KILL_RANK"] = who
    extra = ["--async-save"] if mode == "async" else []
    p = run(MPI + [MCPP, "train", *M, *extra, "--train-iters", "4", "--load", d, "--save", d], env)
    if p.returncode == 0:
        failures.append(f"{tag}: the run was not killed")
    lat = latest(d)
    expect = {"2"} if pt in BEFORE_VOTE or pt in TRACKER_2 else {"4"} if pt in TRACKER_4 else {"2", "4"}
    if lat not in expect:
        failures.append(f"{tag}: latest is {lat}, expected {sorted(expect)}")
    names = sorted(os.listdir(d))
    if (pt in BEFORE_VOTE or pt in NO_DIR) and "iter_0000004" in names:
        failures.append(f"{tag}: iter_0000004 exists although the commit never renamed it")
    for n in names:
        path = os.path.join(d, n)
        if not (n.startswith("iter_") and os.path.isdir(path)):
            continue
        if any(x in n for x in LEFTOVER):
            if verify(path).returncode == 0:
                failures.append(f"{tag}: uncommitted / set-aside directory {n} verifies as a checkpoint")
        elif not os.path.exists(os.path.join(path, "manifest.json")):
            failures.append(f"{tag}: {n} is visible without a manifest (half deleted)")
        elif verify(path).returncode != 0:
            failures.append(f"{tag}: committed {n} does not verify")
    v = verify(d)
    if v.returncode != 0:
        failures.append(f"{tag}: the tracker's checkpoint does not verify: {v.stderr[-500:]}")
    # The next start: two more iterations (from 2 this saves 4 again, moving an orphaned iter_0000004 aside first).
    nxt = int(lat) + 2
    metrics = os.path.join(WORK, f"m_{mode}_{pt}_{who}.jsonl")
    q = run(MPI + [MCPP, "train", *M, *extra, "--train-iters", str(nxt), "--load", d, "--save", d,
                   "--metrics-path", metrics])
    got = train_records(metrics)
    if q.returncode != 0 or latest(d) != str(nxt):
        failures.append(f"{tag}: resume from {lat} failed (exit {q.returncode}): {q.stderr[-800:]}")
    elif sorted(got) != list(range(int(lat) + 1, nxt + 1)) or any(got[i] != reference[i] for i in got):
        failures.append(f"{tag}: resumed from {lat}: {got} differs from the uninterrupted run {reference}")
    after = sorted(n for n in os.listdir(d) if n.startswith("iter_"))
    if after != [f"iter_{nxt:07d}"]:
        failures.append(f"{tag}: after the next start the save directory holds {after} (want only iter_{nxt:07d})")
    print(f"{tag}: latest {lat}, dirs {[n for n in names if n.startswith('iter_')]}; resumed bit-exact to {nxt}, "
          f"then {after}", flush=True)

if failures:
    print("FAIL\n" + "\n".join(failures))
    sys.exit(1)
points = len(ALL_RANKS) + len(RANK0) + len(RETENTION)
print(f"OK: {len(cases)} kills at {points} points (sync and async); the tracker's checkpoint always verifies and "
      f"resumes bit-exactly, and the next start leaves committed checkpoints only")
