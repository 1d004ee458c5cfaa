"""E12: a rank killed mid-save and a corrupted shard: detection, abort, cleanup and restore (flags / hooks on main).

Each repeat (`mcpp launch --nproc-per-node 2`, DP2, TCP world):
  ref      4 iterations uninterrupted, saving at 2 and 4
  pre      the same run stopped at 2 (--exit-interval 2): iteration 2 committed
  fault    resumed from 2; rank 1 SIGKILLed during the save of iteration 4 after its model file's fsync
           (MCPP_FAULT_KILL_AT=after_fsync_model, the commit protocol's test hook): the launcher must name the
           rank and stop the others; the interrupted save leaves only its staging directory
  restore  resumed again: loads iteration 2, removes the stale staging directory, finishes 3 and 4
  shard    one byte of a shard of iteration 2 flipped (in a copy): the load must refuse it
Metrics: the fault run's wall time (start to the job's end: detection + abort), processes left after it, the
staging directories it left, the restore's load time and wall time, the corrupted load's time to its error.
Oracle: the launcher names "rank 1 was killed by signal 9" and the job exits non-zero; no process of the job
survives; iteration 4 was not committed (latest stays 2, one *.tmp-* left); the restore logs the stale path's
removal and its iterations 3 and 4 equal the uninterrupted run's bit for bit; the corrupted shard ends in one
error naming a checksum mismatch and exit code 2.
Not here (issue 33's fault injection): a wrong collective, slow data.
"""
import glob
import os
import shutil
import time

import ckpt
import formulas as F
import runner
from runner import check

ID, TITLE = "E12", "fault: a rank killed mid-save, a corrupted shard"
KEY = ["fault_wall_s", "restore_load_ms", "restore_wall_s", "shard_error_wall_s"]


def model(s):
    return ["train", "--num-layers", "2", "--hidden-size", str(s["hidden"]), "--num-attention-heads", "4",
            "--seq-length", "16", "--max-position-embeddings", "16", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "256", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
            "--log-interval", "1", "--eval-iters", "0", "--split", "100,0,0", "--save-interval", "2",
            "--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "4",
            "--distributed-timeout-minutes", "1"]


TIERS = {"cpu": {"hidden": 32, "kill_rank": "1"},
         "gpu": "the drill kills, hangs and mis-calls one of 2 ranks: NCCL needs a GPU per rank, run on "
                "nvidia-h100-x2 (one GPU: the cpu tier, or bench/gpu/nan_check_overhead.sh's NaN drill)"}


def broken(s):
    s["kill_rank"] = "5"  # no such rank: nothing is killed, so there is no fault to detect
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", 256, tokens=20000)
    ctx.obs = []


def launch(ctx, name, args, env=None):
    t0 = time.time()
    rc, outs, d = ctx.mcpp_run(name, ["launch", "--nproc-per-node", "2", "--", *args], expect_ok=False, env=env,
                               metrics=False)
    return rc, outs[0] + ctx.last_stderr, time.time() - t0  # the launcher and the log's warnings go to stderr


def losses(path):
    """{iteration: lm loss} of a metrics file (the last rank's)."""
    import json
    return {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(path)) if r.get("event") == "train"} \
        if os.path.exists(path) else {}


def repeat(ctx, s):
    m, ob = model(s) + ["--data-path", ctx.data], {}
    ref, ck = ctx.path("ref", "ck"), ctx.path("ck", "ck")
    ref_m, fault_m, rest_m = ctx.path("ref", "m.jsonl"), ctx.path("ck", "fault.jsonl"), ctx.path("ck", "rest.jsonl")
    launch(ctx, "ref", m + ["--save", ref, "--metrics-path", ref_m])
    rc, _, _ = launch(ctx, "pre", m + ["--exit-interval", "2", "--save", ck, "--metrics-path", ctx.path("ck", "pre.jsonl")])
    if rc != 0:
        raise runner.RunFailed(f"pre: exit {rc}")
    rc, out, wall = launch(ctx, "fault", m + ["--load", ck, "--save", ck, "--metrics-path", fault_m],
                           env={"MCPP_FAULT_KILL_AT": "after_fsync_model", "MCPP_FAULT_KILL_RANK": s["kill_rank"]})
    # which rank reports first is a race (the launcher's SIGCHLD or rank 0's reset TCP connection): both are named
    ob["fault_rc"], ob["named"] = rc, "rank 1 was killed by signal 9" in out and "stopping the other ranks" in out
    ob["stray"] = len(runner.tagged_processes(ctx.tag))
    ob["staging"] = len(glob.glob(os.path.join(ck, "iter_*.tmp-*")))
    ob["latest"] = open(os.path.join(ck, "latest_checkpointed_iteration.txt")).read().strip()
    shard_copy = ctx.path("shard", "ck")
    shutil.copytree(ck, shard_copy, ignore=shutil.ignore_patterns("*.tmp-*", "*.jsonl"))
    rc_r, out_r, wall_r = launch(ctx, "restore", m + ["--load", ck, "--save", ck, "--metrics-path", rest_m])
    ob["restore_rc"], ob["stale_removed"] = rc_r, "removed stale checkpoint path" in out_r
    a, b = losses(ref_m), losses(rest_m)
    ob["bit_exact"] = bool(b) and all(b.get(i) == a.get(i) for i in (3, 4))
    line = next((l for l in out_r.splitlines() if "loaded checkpoint from" in l), "")
    load_ms = float(line.split(" in ")[1].split()[0]) if line else float("nan")
    it = ckpt.iter_dir(shard_copy, 2)
    e = next(e for e in ckpt.manifest(it)["tensors"] if e["key"].endswith("linear_fc1.weight"))
    with open(os.path.join(it, e["file"]), "r+b") as f:
        f.seek(e["byte_offset"] + 3)
        x = f.read(1)
        f.seek(e["byte_offset"] + 3)
        f.write(bytes([x[0] ^ 0x40]))
    rc_s, out_s, wall_s = launch(ctx, "shard", m + ["--load", shard_copy, "--metrics-path", ctx.path("shard", "m.jsonl")])
    errs = [l for l in out_s.splitlines() if l.startswith("error:") or "] error:" in l or l.startswith("error")]
    ob["shard_rc"], ob["shard_named"] = rc_s, any("checksum mismatch" in l for l in out_s.splitlines())
    ctx.obs.append(ob)
    return {"fault_wall_s": wall, "restore_wall_s": wall_r, "restore_load_ms": load_ms, "shard_error_wall_s": wall_s,
            "staging_left": ob["staging"], "stray_processes": ob["stray"], "shard_error_lines": len(errs)}


def oracle(ctx, s, repeats):
    o = ctx.obs
    return [check("the fault ends the job (non-zero) and the launcher names rank 1's SIGKILL, stopping the others",
                  all(x["fault_rc"] != 0 and x["named"] for x in o), f"exit codes {[x['fault_rc'] for x in o]}"),
            check("no process of the job survives it", all(x["stray"] == 0 for x in o)),
            check("iteration 4 not committed: latest stays 2, its staging directory left",
                  all(x["latest"] == "2" and x["staging"] == 1 for x in o),
                  f"latest {[x['latest'] for x in o]}, staging {[x['staging'] for x in o]}"),
            check("restore: loads 2, removes the stale staging path, iterations 3-4 bit-exact",
                  all(x["restore_rc"] == 0 and x["stale_removed"] and x["bit_exact"] for x in o),
                  f"exit {[x['restore_rc'] for x in o]}, stale removed {[x['stale_removed'] for x in o]}, "
                  f"bit-exact {[x['bit_exact'] for x in o]}"),
            check("a corrupted shard: exit 2 naming a checksum mismatch",
                  all(x["shard_rc"] == 2 and x["shard_named"] for x in o), f"exit codes {[x['shard_rc'] for x in o]}")]


def negative(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    return (f"Waiting out --distributed-timeout-minutes does not help detection: the job ended "
            f"{med('fault_wall_s'):.2f} s after its start (the launcher sees the child's SIGKILL at once and stops "
            f"the others), while the surviving rank's collective timeout is 60 s.\n\nReason: a dead process is a "
            f"launcher event, not a hang; the watchdog's timeout is for ranks that live but do not arrive (issue 33 "
            f"measures that case).\n")


def report(s, summary, checks):
    return "## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + ", DP2 via `mcpp launch`\n\n## Times\n\n" + \
        runner.stats_table(summary, KEY + ["staging_left", "stray_processes"])
