"""E12: faults from the scene to the root cause: detection, abort, cleanup and restore.

Form "dp2" (cpu tier on 2 CPU ranks; gpu-multi on 2 GPUs) — a rank killed mid-save and a corrupted shard. Each
repeat (`mcpp launch --nproc-per-node 2`, DP2, TCP world):
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
gpu-multi adds the collective faults (--inject-fault, MCPP_DISTRIBUTED_TIMEOUT_SECONDS=3): hang@3:1 — the
watchdog's "distributed timeout" and `mcpp debug hang` naming rank 1 the culprit; wrong-collective@3:1 with
--check-collectives — the mismatch (count 3 on the world group) named.

Form "one" (gpu tier, one GPU, one rank; bf16, --deterministic-mode so reruns and restarts are bit-exact) — the faults
that make sense with one rank (--inject-fault, docs/DEBUGGING.md), each repeat:
  ref      6 iterations uninterrupted (the losses every drill is compared with); bad-shard@6 flips a byte of its
           final checkpoint after the commit (the losses are untouched)
  nan      nan-grad:layer=0@3 (one-off) and nan-grad:layer=1,persistent@5: the re-run classifies 3 transient and
           5 reproducible naming decoder.layers.1.mlp's gradient; both steps skipped, training goes on
  kill     `mcpp launch --nproc-per-node 1 --max-restarts 1 -- train ... kill@3 --save K --load K`: the launcher
           names the SIGKILL, restarts the job, which resumes from iteration 2 and logs 3..6 equal to ref's
  slow     slow-data:ms=400@2 with --timing-log-level 2: the batch-generator timer names the data loader
  shard    --load of ref's corrupted checkpoint: one error naming the flipped file's checksum, exit 2
Times: detection (kill: the launcher's line after the iteration-2 commit; NaN: the re-run's cost over a healthy
step; slow data: the timer's excess), abort + cleanup (the launcher's line to its restart line), restore (restart
line to the first resumed step; the load's own ms), time to the corrupted shard's error.
hang / wrong-collective need two ranks, and NCCL cannot put two ranks of one communicator on one GPU: refused on the
gpu tier (recorded in the report), run by gpu-multi.
"""
import glob
import json
import os
import shutil
import time

import ckpt
import formulas as F
import runner
from runner import check

ID, TITLE = "E12", "fault: a rank killed mid-save, a corrupted shard"
KEY = ["fault_wall_s", "restore_load_ms", "restore_wall_s", "shard_error_wall_s", "kill_detect_ms",
       "kill_abort_ms", "kill_restore_s", "nan_transient_extra_ms", "slow_data_extra_ms"]
NCCL_ONE_GPU = ("needs 2 ranks, and NCCL cannot place two ranks of one communicator on one GPU (NCCL User Guide, "
                "'Creating a Communicator': using the same CUDA device as different ranks of the same communicator "
                "is not supported; ncclCommInitRank reports 'Duplicate GPU detected'): run --tier gpu-multi (2 GPUs) "
                "or the cpu tier")


def model(s):
    return ["train", "--num-layers", "2", "--hidden-size", str(s["hidden"]), "--num-attention-heads", "4",
            "--seq-length", "16", "--max-position-embeddings", "16", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "256", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
            "--log-interval", "1", "--eval-iters", "0", "--split", "100,0,0", "--save-interval", "2",
            "--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "4",
            "--distributed-timeout-minutes", "1", *s.get("device", [])]


TIERS = {"cpu": {"hidden": 32, "kill_rank": "1"},
         "gpu": {"form": "one", "layers": 4, "hidden": 512, "heads": 8, "seq": 1024, "vocab": 8192, "mbs": 4,
                 "iters": 6, "slow_ms": 400, "device": ["--device", "cuda", "--bf16", "--deterministic-mode"],
                 "refused": {"hang": NCCL_ONE_GPU, "wrong-collective": NCCL_ONE_GPU}},
         "gpu-multi": {"hidden": 256, "kill_rank": "1", "collective_drills": True, "device": ["--device", "cuda"],
                       "gpus": 2, "why_gpus": "the drills kill, hang and mis-call one of 2 ranks: " + NCCL_ONE_GPU}}
# --smoke: the gpu tiers' code on CPU ranks (fp32, small shapes)
SMOKE = {"gpu": {"layers": 2, "hidden": 32, "heads": 4, "seq": 32, "vocab": 256, "mbs": 2, "device": []},
         "gpu-multi": {"hidden": 32, "device": []}}


def broken(s):
    if s.get("form") == "one":
        s["kill_without_load"] = True  # the restarted job is not told to resume: it cannot restore iteration 2
    else:
        s["kill_rank"] = "5"  # no such rank: nothing is killed, so there is no fault to detect
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", s.get("vocab", 256),
                                 tokens=max(20000, s.get("mbs", 2) * (s.get("seq", 16) + 1) * (s.get("iters", 4) + 4)))
    ctx.obs = []


def repeat(ctx, s):
    return repeat_one(ctx, s) if s.get("form") == "one" else repeat_dp2(ctx, s)


def oracle(ctx, s, repeats):
    return oracle_one(ctx, s, repeats) if s.get("form") == "one" else oracle_dp2(ctx, s, repeats)


def negative(ctx, s):
    return negative_one(ctx, s) if s.get("form") == "one" else negative_dp2(ctx, s)


def report(s, summary, checks):
    return report_one(s, summary) if s.get("form") == "one" else report_dp2(s, summary)


def losses(path):
    """{iteration: lm loss} of a metrics file (the last rank's; a restarted job's later records win)."""
    return {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(path)) if r.get("event") == "train"} \
        if os.path.exists(path) else {}


def error_lines(text):
    return [l for l in text.splitlines() if l.startswith("error:") or "] error:" in l or l.startswith("error")]


# ----------------------------------------------------------------------------- form "dp2": 2 ranks
def launch(ctx, name, args, env=None):
    t0 = time.time()
    rc, outs, d = ctx.mcpp_run(name, ["launch", "--nproc-per-node", "2", "--", *args], expect_ok=False, env=env,
                               metrics=False)
    return rc, outs[0] + ctx.last_stderr, time.time() - t0  # the launcher and the log's warnings go to stderr


def repeat_dp2(ctx, s):
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
    errs = error_lines(out_s)
    ob["shard_rc"], ob["shard_named"] = rc_s, any("checksum mismatch" in l for l in out_s.splitlines())
    res = {"fault_wall_s": wall, "restore_wall_s": wall_r, "restore_load_ms": load_ms, "shard_error_wall_s": wall_s,
           "staging_left": ob["staging"], "stray_processes": ob["stray"], "shard_error_lines": len(errs)}
    if s.get("collective_drills"):
        res.update(collective_drills(ctx, s, m, ob))
    ctx.obs.append(ob)
    return res


def collective_drills(ctx, s, m, ob):
    """hang@3:1 (watchdog + `mcpp debug hang`) and wrong-collective@3:1 with --check-collectives, 2 ranks."""
    env = {"MCPP_DISTRIBUTED_TIMEOUT_SECONDS": "3"}
    hang = ctx.path("hang", "ck")
    rc, out, wall = launch(ctx, "hang", m + ["--inject-fault", "hang@3:1", "--save", hang],
                           env=env)
    ob["hang_rc"], ob["hang_named"] = rc, "distributed timeout" in out
    ob["hang_stray"] = len(runner.tagged_processes(ctx.tag))
    t0 = time.time()
    _, outs, _ = ctx.mcpp_run("debug-hang", ["debug", "hang", hang, "--json"], expect_ok=False, metrics=False)
    diag_s = time.time() - t0
    try:
        rep = json.loads(outs[0])
    except ValueError:
        rep = {}
    ob["hang_culprit"] = rep.get("culprit_rank")
    rc_w, out_w, wall_w = launch(ctx, "wrong-collective", m + ["--inject-fault", "wrong-collective@3:1",
                                                               "--check-collectives"], env=env)
    ob["wrong_rc"] = rc_w
    ob["wrong_named"] = "mismatched collective in group 'world'" in out_w and "count 3" in out_w
    ob["wrong_stray"] = len(runner.tagged_processes(ctx.tag))
    return {"hang_wall_s": wall, "hang_diagnosis_s": diag_s, "wrong_collective_wall_s": wall_w}


def oracle_dp2(ctx, s, repeats):
    o = ctx.obs
    res = [check("the fault ends the job (non-zero) and the launcher names rank 1's SIGKILL, stopping the others",
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
    if s.get("collective_drills"):
        res += [check("hang@3:1: the job ends non-zero with the watchdog's 'distributed timeout', no process left",
                      all(x["hang_rc"] != 0 and x["hang_named"] and x["hang_stray"] == 0 for x in o),
                      f"exit codes {[x['hang_rc'] for x in o]}"),
                check("`mcpp debug hang` names rank 1 the culprit", all(x["hang_culprit"] == 1 for x in o),
                      f"culprits {[x['hang_culprit'] for x in o]}"),
                check("wrong-collective@3:1 + --check-collectives: the mismatch named (world group, count 3)",
                      all(x["wrong_rc"] != 0 and x["wrong_named"] and x["wrong_stray"] == 0 for x in o),
                      f"exit codes {[x['wrong_rc'] for x in o]}")]
    return res


def negative_dp2(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    return (f"Waiting out --distributed-timeout-minutes does not help detection: the job ended "
            f"{med('fault_wall_s'):.2f} s after its start (the launcher sees the child's SIGKILL at once and stops "
            f"the others), while the surviving rank's collective timeout is 60 s.\n\nReason: a dead process is a "
            f"launcher event, not a hang; the watchdog's timeout is for ranks that live but do not arrive (issue 33 "
            f"measures that case).\n")


def report_dp2(s, summary):
    extra = ["hang_wall_s", "hang_diagnosis_s", "wrong_collective_wall_s"] if s.get("collective_drills") else []
    return "## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + ", DP2 via `mcpp launch`\n\n## Times\n\n" + \
        runner.stats_table(summary, KEY[:4] + ["staging_left", "stray_processes"] + extra)


# ----------------------------------------------------------------------------- form "one": one rank, one GPU
def model_one(s, data, iters=None):
    return ["train", "--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads",
            str(s["heads"]), "--seq-length", str(s["seq"]), "--max-position-embeddings", str(s["seq"]),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(s["vocab"]), "--micro-batch-size", str(s["mbs"]),
            "--global-batch-size", str(s["mbs"]), "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0",
            "--split", "100,0,0", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "12",
            "--train-iters", str(iters or s["iters"]), "--data-path", data, *s["device"]]


NAN_SPECS = ["nan-grad:layer=0@3", "nan-grad:layer=1,persistent@5"]


def healthy_median(recs, skip):
    """Median step ms of the iterations after the first that are not in skip."""
    return F.median([r["elapsed_ms_per_iter"] for r in recs if r["iteration"] > 1 and r["iteration"] not in skip])


def kill_restart(ctx, s, ob):
    """kill@3 under `mcpp launch --max-restarts 1`, timed from the launcher's stderr and the checkpoint / metrics files."""
    k, km = ctx.path("kill", "ck"), ctx.path("kill", "m.jsonl")
    latest = os.path.join(k, "latest_checkpointed_iteration.txt")
    seen = {}

    def poll():
        if "commit2" not in seen and os.path.exists(latest):
            try:
                if open(latest).read().strip() == "2":
                    seen["commit2"] = time.time()
            except OSError:
                pass
        if "commit2" in seen and "iter3" not in seen and os.path.exists(km):
            try:
                if any(r.get("event") == "train" and r.get("iteration") == 3 for r in map(json.loads, open(km))):
                    seen["iter3"] = time.time()
            except (OSError, ValueError):  # a line being written
                pass
    load = [] if s.get("kill_without_load") else ["--load", k]
    rc, out, lines, wall = ctx.mcpp_timed("kill", ["launch", "--nproc-per-node", "1", "--max-restarts", "1", "--",
                                                   *model_one(s, ctx.data), "--save", k, *load, "--save-interval", "2",
                                                   "--inject-fault", "kill@3", "--metrics-path", km], poll=poll)
    err = "\n".join(l for _, l in lines)
    t_kill = next((t for t, l in lines if "rank 0 was killed by signal 9" in l), None)
    t_restart = next((t for t, l in lines if "restarting the job (restart 1 of 1" in l), None)
    ob["kill_rc"], ob["kill_named"], ob["restarted"] = rc, t_kill is not None, t_restart is not None
    ob["kill_stray"] = len(runner.tagged_processes(ctx.tag))
    ob["kill_staging"] = len(glob.glob(os.path.join(k, "iter_*.tmp-*")))
    line = next((l for l in (out + "\n" + err).splitlines() if "loaded checkpoint from" in l), "")
    ob["resumed_at_2"] = "at iteration 2" in line
    ob["kill_losses"] = losses(km)
    res = {"kill_wall_s": wall, "kill_load_ms": float(line.split(" in ")[1].split()[0]) if line else float("nan")}
    if t_kill and "commit2" in seen:
        res["kill_detect_ms"] = (t_kill - seen["commit2"]) * 1e3
    if t_kill and t_restart:
        res["kill_abort_ms"] = (t_restart - t_kill) * 1e3
    if t_restart and "iter3" in seen:
        res["kill_restore_s"] = seen["iter3"] - t_restart
    return res


def repeat_one(ctx, s):
    ob, out = {}, {}
    # ref: uninterrupted; bad-shard@<last> flips a byte of the final checkpoint after its commit
    ref = ctx.path("ref", "ck")
    t0 = time.time()
    _, _, d = ctx.mcpp_run("ref", [*model_one(s, ctx.data), "--save", ref, "--save-interval", str(s["iters"]),
                                   "--inject-fault", f"bad-shard@{s['iters']}"])
    out["ref_wall_s"] = time.time() - t0
    ref_recs = runner.records(d, "train")
    ob["ref_losses"] = {r["iteration"]: r["lm_loss"] for r in ref_recs}
    flipped = next((l.rsplit(" ", 1)[1] for l in ctx.last_stderr.splitlines() if "flipped a byte of" in l), "")
    ob["flipped"] = os.path.basename(flipped)
    out["healthy_step_ms"] = healthy_median(ref_recs, ())
    # nan: a one-off and a persistent NaN gradient
    nan_args = [a for spec in NAN_SPECS for a in ("--inject-fault", spec)]
    _, _, d = ctx.mcpp_run("nan", [*model_one(s, ctx.data), *nan_args])
    recs = runner.records(d, "train")
    ob["nan_incidents"] = {r["iteration"]: r for r in runner.records(d, "rerun_incident")}
    ob["nan_recs"] = recs
    healthy = healthy_median(recs, (3, 5))
    step = {r["iteration"]: r["elapsed_ms_per_iter"] for r in recs}
    out["nan_transient_extra_ms"] = step.get(3, float("nan")) - healthy
    out["nan_persistent_extra_ms"] = step.get(5, float("nan")) - healthy
    # kill + restart
    out.update(kill_restart(ctx, s, ob))
    # slow data loader at iteration 2
    _, _, d = ctx.mcpp_run("slow", [*model_one(s, ctx.data), "--inject-fault", f"slow-data:ms={s['slow_ms']}@2",
                                    "--timing-log-level", "2"])
    bg = {r["iteration"]: r["timers_ms"].get("batch-generator", 0.0) for r in runner.records(d, "train", rank=0)}
    ob["slow_bg"] = bg
    out["slow_data_extra_ms"] = bg.get(2, 0.0) - F.median([v for i, v in bg.items() if i != 2])
    # the corrupted final checkpoint of ref
    rc, outs, _ = ctx.mcpp_run("shard", [*model_one(s, ctx.data, s["iters"] + 2), "--load", ref], expect_ok=False)
    out["shard_error_wall_s"] = ctx.last_wall_s
    errs = error_lines(outs[0] + "\n" + ctx.last_stderr)
    ob["shard_rc"], ob["shard_errs"] = rc, errs
    ctx.obs.append(ob)
    return out


def oracle_one(ctx, s, repeats):
    o, n = ctx.obs, s["iters"]
    inc_ok, cont_ok, same_ok = [], [], []
    for x in o:
        i3, i5 = x["nan_incidents"].get(3, {}), x["nan_incidents"].get(5, {})
        c5 = i5.get("first_non_finite") or {}
        inc_ok.append((i3.get("classification"), i3.get("action"), i3.get("first_non_finite"),
                       i5.get("classification"), c5.get("module"), c5.get("tensor"), c5.get("layer"), c5.get("rank")))
        last = x["nan_recs"][-1] if x["nan_recs"] else {}
        cont_ok.append([r["iteration"] for r in x["nan_recs"]] == list(range(1, n + 1)) and
                       last.get("skipped_iters") == 2 and last.get("nan_iters") == 2 and
                       all(r["lm_loss"] == r["lm_loss"] for r in x["nan_recs"] if r["iteration"] not in (3, 5)))
        same_ok.append(all(r["lm_loss"] == x["ref_losses"].get(r["iteration"]) for r in x["nan_recs"]
                           if r["iteration"] < 3))
    want = ("transient", "skipped", None, "reproducible", "decoder.layers.1.mlp", "gradient", 1, 0)
    kl = [x["kill_losses"] for x in o]
    return [
        check("nan: iteration 3 transient (the re-run is healthy), 5 reproducible naming decoder.layers.1.mlp's "
              "gradient (layer 1, rank 0)", all(t == want for t in inc_ok), f"got {inc_ok[0]}"),
        check(f"nan: both steps skipped (skipped = nan iterations = 2), iterations 1..{n} logged, the others finite",
              all(cont_ok)),
        check("nan: iterations 1-2 equal the uninterrupted run's bit for bit (healthy steps untouched)", all(same_ok)),
        check("kill: the launcher names rank 0's SIGKILL and restarts the job once; it exits 0, no process or "
              "staging directory left",
              all(x["kill_rc"] == 0 and x["kill_named"] and x["restarted"] and x["kill_stray"] == 0 and
                  x["kill_staging"] == 0 for x in o),
              f"exit {[x['kill_rc'] for x in o]}, named {[x['kill_named'] for x in o]}, restarted "
              f"{[x['restarted'] for x in o]}"),
        check(f"kill: the restart resumes from iteration 2; iterations 1..{n} equal the uninterrupted run's bit for bit",
              all(x["resumed_at_2"] and sorted(x["kill_losses"]) == list(range(1, n + 1)) and
                  all(x["kill_losses"][i] == x["ref_losses"].get(i) for i in x["kill_losses"]) for x in o),
              f"resumed at 2 {[x['resumed_at_2'] for x in o]}; restart {kl[0]}"),
        check(f"slow-data: the batch-generator timer shows >= {s['slow_ms']} ms at iteration 2, < 100 ms elsewhere",
              all(x["slow_bg"].get(2, 0) >= s["slow_ms"] and all(v < 100 for i, v in x["slow_bg"].items() if i != 2)
                  for x in o), f"{o[0]['slow_bg']}"),
        check("bad-shard: loading the corrupted checkpoint is one error naming the flipped file's checksum, exit 2",
              all(x["shard_rc"] == 2 and len(x["shard_errs"]) == 1 and "checksum" in x["shard_errs"][0] and
                  x["flipped"] and x["flipped"] in x["shard_errs"][0] for x in o),
              f"exit {[x['shard_rc'] for x in o]}, flipped {o[0]['flipped']}: {o[0]['shard_errs'][:1]}"),
    ]


def negative_one(ctx, s):
    """The same NaN faults with --no-check-for-nan-in-loss-and-grad (one run)."""
    _, _, d = ctx.mcpp_run("no-nan-check", [*model_one(s, ctx.data), "--no-check-for-nan-in-loss-and-grad",
                                            *[a for spec in NAN_SPECS for a in ("--inject-fault", spec)]])
    recs, inc = runner.records(d, "train"), runner.records(d, "rerun_incident")
    off = healthy_median(recs, (3, 5))
    on = F.median([r["healthy_step_ms"] for r in ctx.repeats])
    skipped = recs[-1].get("skipped_iters") if recs else None
    verdict = "does not help" if off > 0.97 * on else "helps"
    return (f"Turning the NaN check off (--no-check-for-nan-in-loss-and-grad) with the same two NaN gradients "
            f"{verdict} the healthy steps ({off:.2f} ms vs {on:.2f} ms with the check, medians), and it loses the "
            f"diagnosis: {len(inc)} incidents recorded (vs 2), the steps still skipped ({skipped}).\n\nReason: a "
            f"healthy step runs no per-module check (nothing is installed until a non-finite grad norm; "
            f"bench/gpu/nan_check_overhead.sh measures < 1 %), while without it nothing re-runs the step, so neither "
            f"the transient / reproducible verdict nor the first non-finite module is known.\n")


def report_one(s, summary):
    refused = "".join(f"- `{k}`: refused on one GPU — {v}\n" for k, v in s.get("refused", {}).items())
    keys = ["ref_wall_s", "healthy_step_ms", "nan_transient_extra_ms", "nan_persistent_extra_ms", "kill_detect_ms",
            "kill_abort_ms", "kill_restore_s", "kill_load_ms", "kill_wall_s", "slow_data_extra_ms",
            "shard_error_wall_s"]
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items() if k != "refused") +
            ", one rank\n\n## Fault kinds not run on one GPU\n\n" + refused + "\n## Times\n\n"
            "detection: kill_detect_ms (the iteration-2 commit to the launcher's line; the kill fires at the start of "
            "iteration 3), nan_*_extra_ms (the step with the re-run over a healthy step), slow_data_extra_ms (the "
            "timer's excess); abort + cleanup: kill_abort_ms (the launcher's line to its restart: the rank reaped, the "
            "rendezvous cleared); restore: kill_restore_s "
            "(restart to the first resumed step's record), kill_load_ms (the load itself); shard_error_wall_s (start "
            "to the error).\n\n" + runner.stats_table(summary, keys))
