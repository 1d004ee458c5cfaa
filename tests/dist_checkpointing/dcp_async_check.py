#!/usr/bin/env python3
"""--async-save, --keep-last-n-checkpoints and per-rank RNG through `mcpp train` (issue 5).

usage: dcp_async_check.py MCPP WORKDIR
  1. async == sync: for 1 rank and 4 ranks (TP2 x DP2 + distributed optimizer), dropout on, a run with
     --async-save and one without (--save-interval 2, 6 iterations) write byte-identical data files at
     iterations 2, 4, 6; the manifests are equal except meta.config.training.{save, async_save} and
     meta.provenance.argv (the flags that differ between the two runs); the losses are identical; the async log reports the
     snapshot pause as "save-checkpoint pause (ms)" and the JSONL has a save_start record with pause_ms.
  2. a failed background write (MCPP_FAULT_FAIL_AT=after_fsync_model on rank 1 at iteration 4) ends the
     run with exit 2 and an error naming iteration 4 and the save directory; latest stays 2, which verifies.
  2b. SIGKILL in the writer thread (all ranks mid-file, rank 1 after fsync) and at the deferred vote:
     latest stays 2 and verifies; a resume cleans the staging dir, trains to 6 and commits 4 and 6.
  3. retention: --keep-last-n-checkpoints 2 (async) keeps iterations 6 and 8 only; a stale
     iter_*.tmp-* directory from a "crashed" save is removed at startup and reported.
  4. per-rank RNG: at TP2 and at PP2 (dropout 0.1), 3 iterations + resume to 6 reproduce the
     uninterrupted run's losses bit for bit; meta.rng_per_rank has one entry per rank; loading the PP2
     checkpoint at PP1 says in the log that the per-rank RNG states were not restored.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle", "cli"))
from cli_harness import MCPP, WORK, failures, losses, record_corpus, run  # noqa: E402  argv, fresh work dir, run()


def records(d, event):
    p = os.path.join(d, "metrics.jsonl")
    return [r for r in map(json.loads, open(p)) if r.get("event") == event] if os.path.exists(p) else []


def iters(d):
    return sorted(n for n in os.listdir(d) if n.startswith("iter_")) if os.path.isdir(d) else []


record_corpus()
M = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
     "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
     "--lr-warmup-iters", "1", "--lr-decay-iters", "8", "--log-interval", "1", "--eval-interval", "100",
     "--eval-iters", "1", "--split", "90,10,0", "--make-vocab-size-divisible-by", "32",
     "--attention-impl", "unfused", "--data-path", os.path.join(WORK, "c_text_document"),
     "--seed", "5"]  # dropout: defaults (0.1), on the unfused attention's materialized probs
TP2DP2 = ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--ddp-bucket-size", "3000"]


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle", "ckpt"))
import manifest_checksum  # noqa: E402


def manifest_without_run_flags(path):
    m = json.load(open(path))
    manifest_checksum.check(m)  # then drop the checksum: a function of the rest, which differs in the run flags
    m.pop(manifest_checksum.WHOLE)
    m.pop(manifest_checksum.FIELDS)
    t = m["meta"]["config"]["training"]
    for k in ("save", "async_save"):
        t.pop(k, None)
    m["meta"].get("provenance", {}).pop("argv", None)  # the command line: it holds the same two flags
    return m


# 1. async == sync
for name, np_, flags in (("1rank", 1, []), ("tp2dp2", 4, TP2DP2)):
    dirs = {}
    for mode in ("sync", "async"):
        d = os.path.join(WORK, f"{name}_{mode}")
        extra = ["--async-save"] if mode == "async" else []
        p = run([MCPP, "train", *M, *flags, "--train-iters", "6", "--save-interval", "2", "--save", d, *extra], np_)
        dirs[mode] = (d, p)
    (ds, _), (da, pa) = dirs["sync"], dirs["async"]
    if iters(ds) != ["iter_0000002", "iter_0000004", "iter_0000006"] or iters(da) != iters(ds):
        failures.append(f"{name}: checkpoints sync {iters(ds)} async {iters(da)}")
    for it in iters(ds):
        fs_, fa = sorted(os.listdir(os.path.join(ds, it))), sorted(os.listdir(os.path.join(da, it))) if os.path.isdir(os.path.join(da, it)) else []
        if fs_ != fa:
            failures.append(f"{name} {it}: files differ {fs_} vs {fa}")
            continue
        for f in fs_:
            a, b = os.path.join(ds, it, f), os.path.join(da, it, f)
            if f == "manifest.json":
                if manifest_without_run_flags(a) != manifest_without_run_flags(b):
                    failures.append(f"{name} {it}: manifests differ beyond training.save/async_save")
            elif open(a, "rb").read() != open(b, "rb").read():
                failures.append(f"{name} {it}: {f} differs between sync and async save")
    if losses(ds) != losses(da) or len(losses(ds)) != 6:
        failures.append(f"{name}: losses sync {losses(ds)} vs async {losses(da)}")
    if "save-checkpoint pause (ms)" not in pa.stdout:
        failures.append(f"{name}: async log lacks 'save-checkpoint pause (ms)'")
    starts = records(da, "save_start")
    if [r["iteration"] for r in starts] != [2, 4, 6] or not all(r["pause_ms"] >= 0 for r in starts):
        failures.append(f"{name}: save_start records {starts}")
    if [r["iteration"] for r in records(da, "save")] != [2, 4, 6]:
        failures.append(f"{name}: async save (commit) records {records(da, 'save')}")
    print(f"{name}: async == sync at {iters(ds)}; pauses (ms) {[round(r['pause_ms'], 1) for r in starts]}")

# 2. a failed background write
d = os.path.join(WORK, "fail")
p = run([MCPP, "train", *M, *TP2DP2, "--train-iters", "6", "--save-interval", "2", "--save", d, "--async-save"], 4,
        expect=None, env={"MCPP_FAULT_FAIL_AT": "after_fsync_model", "MCPP_FAULT_KILL_RANK": "1",
                          "MCPP_FAULT_KILL_ITERATION": "4"})
out = p.stdout + p.stderr
if p.returncode == 0 or "iteration 4" not in out or d not in out or "injected failure at after_fsync_model" not in out:
    failures.append(f"failed async write: exit {p.returncode}, output lacks the named checkpoint:\n{out[-2000:]}")
tracker = open(os.path.join(d, "latest_checkpointed_iteration.txt")).read().strip() if os.path.exists(
    os.path.join(d, "latest_checkpointed_iteration.txt")) else None
if tracker != "2" or iters(d) != ["iter_0000002"]:
    failures.append(f"failed async write: latest {tracker}, dirs {os.listdir(d) if os.path.isdir(d) else None}")
run([MCPP, "ckpt", "verify", d])
print(f"failed async write: exit {p.returncode}, latest {tracker}")

# 2b. SIGKILL during an async save: in the writer thread (all ranks mid-file; rank 1 after its fsync) and
# on the training thread at the vote of the next step boundary. latest stays 2 and verifies; a resume
# removes the staging directory at startup, trains to 6 and commits.
for point, rank in (("mid_file", ""), ("after_fsync_model", "1"), ("before_vote", "")):
    d = os.path.join(WORK, f"kill_{point}_{rank or 'all'}")
    p = run([MCPP, "train", *M, *TP2DP2, "--train-iters", "6", "--save-interval", "2", "--save", d, "--async-save"],
            4, expect=None, env={"MCPP_FAULT_KILL_AT": point, "MCPP_FAULT_KILL_RANK": rank,
                                 "MCPP_FAULT_KILL_ITERATION": "4"})
    tracker = open(os.path.join(d, "latest_checkpointed_iteration.txt")).read().strip()
    if p.returncode == 0 or tracker != "2" or "iter_0000004" in iters(d):
        failures.append(f"kill at {point} (rank {rank or 'all'}): exit {p.returncode}, latest {tracker}, {iters(d)}")
    run([MCPP, "ckpt", "verify", d])
    p = run([MCPP, "train", *M, *TP2DP2, "--train-iters", "6", "--save-interval", "2", "--load", d, "--save", d,
             "--async-save"], 4)
    if iters(d) != ["iter_0000002", "iter_0000004", "iter_0000006"]:
        failures.append(f"resume after kill at {point}: {iters(d)}")
    print(f"kill at {point} (rank {rank or 'all'}): latest {tracker}; resumed to {iters(d)}")

# 3. retention + stale staging clean-up
d = os.path.join(WORK, "keep")
os.makedirs(os.path.join(d, "iter_0000001.tmp-0123456789abcdef"))
open(os.path.join(d, "iter_0000001.tmp-0123456789abcdef", "model.safetensors"), "w").write("partial")
p = run([MCPP, "train", *M, "--train-iters", "8", "--save-interval", "2", "--save", d, "--async-save",
         "--keep-last-n-checkpoints", "2"], 1)
if iters(d) != ["iter_0000006", "iter_0000008"]:
    failures.append(f"retention: {iters(d)} (want iter_0000006, iter_0000008)")
if "removed stale checkpoint path" not in p.stdout + p.stderr:
    failures.append("retention: the stale staging directory removal was not reported")
print(f"retention: {iters(d)}")

# 4. per-rank RNG: resume with dropout is bit-exact at TP2 and PP2
for name, flags in (("tp2", ["--tensor-model-parallel-size", "2"]), ("pp2", ["--pipeline-model-parallel-size", "2"])):
    full = os.path.join(WORK, f"rng_{name}_full")
    run([MCPP, "train", *M, *flags, "--train-iters", "6", "--save", full], 2)
    part = os.path.join(WORK, f"rng_{name}_part")
    run([MCPP, "train", *M, *flags, "--train-iters", "6", "--exit-interval", "3", "--save", part], 2)
    try:
        man = json.load(open(os.path.join(part, "iter_0000003", "manifest.json")))
        if len(man["meta"]["rng_per_rank"]) != 2:
            failures.append(f"rng {name}: rng_per_rank {man['meta']['rng_per_rank']}")
    except (OSError, KeyError) as e:
        failures.append(f"rng {name}: {e!r}")
    run([MCPP, "train", *M, *flags, "--train-iters", "6", "--load", part, "--save", part], 2)
    a, b = losses(full), losses(part)
    if any(a.get(i) is None or a.get(i) != b.get(i) for i in (4, 5, 6)):
        failures.append(f"rng {name}: resumed losses {[b.get(i) for i in (4, 5, 6)]} vs {[a.get(i) for i in (4, 5, 6)]}")
    print(f"rng {name}: resumed losses {[b.get(i) for i in (4, 5, 6)]} (uninterrupted {[a.get(i) for i in (4, 5, 6)]})")
pp2 = os.path.join(WORK, "rng_pp2_part")
p = run([MCPP, "train", *M, "--train-iters", "7", "--load", pp2, "--save",
         os.path.join(WORK, "rng_pp1")], 1, expect=None)
if "per-rank RNG states not restored" not in p.stdout + p.stderr:
    failures.append(f"layout change: log does not say the RNG was not restored:\n{(p.stdout + p.stderr)[-1500:]}")

if failures:
    print("FAIL\n" + "\n".join(failures))
    sys.exit(1)
print("OK: async save byte-identical to sync (1 and 4 ranks), failed async write surfaces, retention, per-rank RNG")
