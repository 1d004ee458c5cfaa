"""training.diagnosis_cli: NaN / Inf localisation and fault injection on CPU ranks (docs/DEBUGGING.md; issue 33).

A. NaN localisation (--check-for-nan-in-loss-and-grad, on by default), the tiny GPT on 2 ranks:
   DP2, nan-grad:layer=1,persistent@3:1: the log and the metrics' rerun_incident name iteration 3, rank 1,
   decoder.layers.1.mlp, its gradient, layer 1, microbatch 0; reproducible; the step skipped (skipped-iterations 1);
   iterations 4..6 train with finite losses; the incident JSON file equals the metrics record; iterations 1..2 equal
   an uninjected run's (the healthy path is untouched).
   DP2, nan-grad:layer=0@2:0 (one-off): transient (the re-run is healthy), skipped, training continues.
   TP2, persistent at layer 1 on rank 1: the TP peer (rank 0) also turns non-finite later (the column-parallel
   all-reduce); the culprit named is rank 1's decoder.layers.1.mlp gradient.
   PP2, nan-output:layer=0,persistent@2:0: stage 1 turns non-finite too; the culprit is rank 0's forward output.
   --no-check-for-nan-in-loss-and-grad: no re-run, the step still skipped.
   --check-for-spiky-loss --spiky-loss-factor 1.0001 (every rising loss is a "spike"): a spiky_loss incident.
B. Faults on 2 ranks, each run in its own session: all ranks exit within the watchdog timeout + 10 s, no process of
   the session left behind, the detector names the fault:
   kill@3:1 (checkpoint at 2): the job fails; restarting from the checkpoint gives iterations 3..6 equal to an
   uninterrupted run (exact restart).
   `mcpp launch --max-restarts 1` with kill@3:1: the job restarts itself, resumes from the iteration-2 checkpoint and
   logs iterations 1..6 equal to the uninterrupted run (MCPP_RESTART_COUNT 1: the drill does not fire again).
   hang@3:1 (MCPP_DISTRIBUTED_TIMEOUT_SECONDS=3): "error: distributed timeout" naming rank 1.
   wrong-collective@3:1 with --check-collectives: the mismatch (count 3 vs 1 on the world group) named;
   wrong-collective:extra@3:1 (a call no peer issues): the watchdog's timeout.
   `mcpp debug hang` on the hang and the wrong-collective dumps: culprit rank 1 (its extra all_reduce of 3 floats on
   the world group), the stuck calls at iteration 3.
   slow-data:ms=400@2:1: rank 1's batch-generator timer at iteration 2 is >= 400 ms / microbatches-per-rank... (each
   microbatch sleeps: >= 400 ms per microbatch), rank 0's is not.
   slow-rank:ms=400@2:1: rank 1's step time at iteration 2 >= 400 ms.
   bad-shard@4:1 (checkpoints at 2 and 4): --load fails with one error naming the rank-1 shard's checksum.
C. --check-collectives on PP2 (P2P fingerprints) leaves the losses unchanged. (Bad --inject-fault values:
   tests/training/inject_fault_cli_check.py.)
"""
import glob
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from cli_harness import ENV, MCPP, MPI, WORK, close, failures, losses, record_corpus, records, run, tiny_train_flags  # noqa: E402

DATA = record_corpus()
BASE = tiny_train_flags(DATA)
WATCHDOG_S = 3


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def train(name, np_, extra, expect=0):
    d = os.path.join(WORK, name)
    p = run([MCPP, "train", *BASE, *extra, "--save", d], np_=np_, expect=expect)
    return d, p.stdout + p.stderr


def incident(d, what):
    recs = records(d, "rerun_incident")
    check(len(recs) == 1, f"{what}: expected one rerun_incident record, got {recs}")
    return recs[0] if recs else {}


def check_culprit(what, inc, iteration, rank, module, tensor, layer, classification):
    c = inc.get("first_non_finite") or {}
    got = (inc.get("iteration"), c.get("rank"), c.get("module"), c.get("tensor"), c.get("layer"), c.get("microbatch"),
           inc.get("classification"))
    want = (iteration, rank, module, tensor, layer, 0, classification)
    check(got == want, f"{what}: incident {got} != {want}: {inc}")


def check_skipped_and_continues(what, d, iteration, log):
    tr = records(d, "train")
    its = [r["iteration"] for r in tr]
    check(its == list(range(1, 7)), f"{what}: iterations logged {its}")
    after = [r for r in tr if r["iteration"] > iteration]
    check(all(r["lm_loss"] == r["lm_loss"] and abs(r["lm_loss"]) < 100 for r in after),
          f"{what}: losses after the skipped step are not finite: {after}")
    last = tr[-1] if tr else {}
    check(last.get("skipped_iters") == 1 and last.get("nan_iters") == 1,
          f"{what}: skipped / nan iterations {last.get('skipped_iters')} / {last.get('nan_iters')} != 1 / 1")
    check("step skipped" in log, f"{what}: no 'step skipped' in the log")


# ---------------- A. NaN localisation
ref, _ = train("ref_dp2", 2, [])
ref_l = losses(ref)
d, log = train("nan_dp2", 2, ["--inject-fault", "nan-grad:layer=1,persistent@3:1"])
inc = incident(d, "DP2 persistent")
check_culprit("DP2 persistent", inc, 3, 1, "decoder.layers.1.mlp", "gradient", 1, "reproducible")
check("first non-finite tensor: decoder.layers.1.mlp gradient (layer 1) on rank 1, microbatch 0" in log,
      f"DP2 persistent: the log does not name the tensor:\n{log[-2000:]}")
check_skipped_and_continues("DP2 persistent", d, 3, log)
files = glob.glob(os.path.join(d, "metrics.incident_iter3.json"))
check(len(files) == 1 and json.load(open(files[0])) == inc, f"DP2 persistent: incident file {files} != the record")
got = losses(d)
check(all(close(got.get(i), ref_l.get(i)) for i in (1, 2)), f"healthy steps changed: {got} vs {ref_l}")
check(any(r.get("event") == "rerun_finding" and r.get("module") == "decoder.layers.1.mlp"
          for r in map(json.loads, open(os.path.join(d, "metrics.rank_1.jsonl")))),
      "DP2 persistent: rank 1's per-rank metrics hold no rerun_finding")

# one-off: the re-run is healthy -> transient; nothing non-finite to name in the re-run
d, log = train("nan_dp2_oneoff", 2, ["--inject-fault", "nan-grad:layer=0@2:0"])
inc = incident(d, "DP2 one-off")
check(inc.get("iteration") == 2 and inc.get("classification") == "transient" and inc.get("first_non_finite") is None
      and inc.get("rerun_grad_norm", -1) > 0, f"DP2 one-off: {inc}")
check("transient" in log, "DP2 one-off: the log does not say transient")
check_skipped_and_continues("DP2 one-off", d, 2, log)

d, log = train("nan_tp2", 2, ["--tensor-model-parallel-size", "2", "--inject-fault",
                              "nan-grad:layer=1,persistent@2:1"])
inc = incident(d, "TP2")
check_culprit("TP2", inc, 2, 1, "decoder.layers.1.mlp", "gradient", 1, "reproducible")
check(sorted(r["rank"] for r in inc.get("ranks", [])) == [0, 1],
      f"TP2: the peer's later non-finite tensor is not reported: {inc.get('ranks')}")

d, log = train("nan_pp2", 2, ["--pipeline-model-parallel-size", "2", "--inject-fault",
                              "nan-output:layer=0,persistent@2:0"])
inc = incident(d, "PP2")
check_culprit("PP2", inc, 2, 0, "decoder.layers.0.mlp", "forward output", 0, "reproducible")
check(sorted(r["rank"] for r in inc.get("ranks", [])) == [0, 1], f"PP2: ranks {inc.get('ranks')}")

d, log = train("nan_nocheck", 2, ["--no-check-for-nan-in-loss-and-grad", "--inject-fault", "nan-grad:layer=1@3:1"])
check(not records(d, "rerun_incident") and "[rerun]" not in log, "--no-check-for-nan-in-loss-and-grad re-ran")
tr = records(d, "train")
check(tr and tr[-1].get("skipped_iters") == 1, f"--no-check-...: the NaN step was not skipped: {tr[-1:]}")

d, log = train("spiky", 1, ["--check-for-spiky-loss", "--spiky-loss-factor", "0.5", "--train-iters", "3"])
sp = records(d, "rerun_incident")
check(sp and sp[0].get("trigger") == "spiky_loss" and sp[0].get("classification") == "reproducible",
      f"--check-for-spiky-loss factor 0.5: expected a reproducible spiky_loss incident at iteration 2, got {sp}")


# ---------------- B. faults: exit, cleanup, naming
def job(name, extra, env=None, np_=2):
    """Runs `mcpp train` on np_ ranks in its own session; returns (rc, seconds, stdout+stderr, save dir)."""
    d = os.path.join(WORK, name)
    cmd = MPI + ["-np", str(np_), MCPP, "train", *BASE, *extra, "--save", d]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env={**ENV, "MCPP_DISTRIBUTED_TIMEOUT_SECONDS": str(WATCHDOG_S), **(env or {})},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        failures.append(f"{name}: the job hung (killed after 120 s)")
    secs = time.monotonic() - t0
    time.sleep(0.5)
    try:
        os.killpg(p.pid, 0)
        failures.append(f"{name}: processes of the job's session are alive after mpiexec returned (orphans)")
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return p.returncode, secs, out + err, d


def fault(name, spec, extra=(), env=None, words=()):
    rc, secs, log, d = job(name, ["--inject-fault", spec, *extra], env)
    check(rc != 0, f"{name}: the job exited 0")
    check(secs <= WATCHDOG_S + 10 + 15, f"{name}: took {secs:.1f} s (start-up ~15 s + timeout {WATCHDOG_S} + 10 s)")
    check(all(w in log for w in words), f"{name}: the output does not name {words}:\n{log[-2500:]}")
    return d, log


ref6, _ = train("ref_save2", 2, ["--save-interval", "2"])
d, _ = fault("kill", "kill@3:1", ["--save-interval", "2"], words=("kill@3:1",))
check(os.path.isdir(os.path.join(d, "iter_0000002")), "kill: no checkpoint at iteration 2")
os.remove(os.path.join(d, "metrics.jsonl"))
run([MCPP, "train", *BASE, "--save-interval", "2", "--load", d, "--save", d], np_=2)
got, want = losses(d), losses(ref6)
check(sorted(got) == [3, 4, 5, 6] and all(close(got[i], want.get(i)) for i in got),
      f"kill: the restart's losses {got} != the uninterrupted run's {want}")



def debug_hang(name, d, rank, op_count=None):
    """`mcpp debug hang d --json` names `rank` the culprit (and, given, its stuck call's op and count)."""
    p = run([MCPP, "debug", "hang", d, "--json"])
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        failures.append(f"{name}: mcpp debug hang printed no JSON: {p.stdout[-1500:]} {p.stderr[-800:]}")
        return
    check(rep.get("culprit_rank") == rank, f"{name}: debug hang's culprit {rep.get('culprit_rank')} != rank {rank}: "
          f"{rep.get('culprit')}")
    stuck = rep.get("stuck", [])
    check(stuck and all(s.get("iteration") == 3 for s in stuck), f"{name}: stuck calls not at iteration 3: {stuck}")
    if op_count:
        c = rep.get("culprit_call", {})
        check((c.get("op"), c.get("count"), c.get("group")) == (*op_count, "world"),
              f"{name}: the culprit's call {c} is not the injected {op_count} on the world group")
    text = run([MCPP, "debug", "hang", d]).stdout
    check(f"culprit: rank {rank}" in text, f"{name}: the text report does not name rank {rank}:\n{text}")


# mcpp launch --max-restarts 1: the killed job restarts by itself and resumes from its checkpoint (--load = --save)
d = os.path.join(WORK, "launch_restart")
t0 = time.monotonic()
p = subprocess.run([MCPP, "launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", "train", *BASE,
                    "--save-interval", "2", "--inject-fault", "kill@3:1", "--save", d, "--load", d],
                   capture_output=True, text=True, env=ENV, timeout=300)
want = losses(ref6)
got = losses(d)
check(p.returncode == 0 and "restarting the job (restart 1 of 1" in p.stderr,
      f"launch --max-restarts: exit {p.returncode}\n{p.stderr[-2000:]}")
check(sorted(got) == list(range(1, 7)) and all(close(got[i], want.get(i)) for i in got),
      f"launch --max-restarts: losses {got} != the uninterrupted run's {want}")

d, _ = fault("hang", "hang@3:1", words=("distributed timeout", "rank 1"))
debug_hang("hang", d, 1)
fault("wrong_collective", "wrong-collective@3:1", ["--check-collectives"],
      words=("mismatched collective in group 'world'", "count 3"))
d, _ = fault("wrong_collective_hang", "wrong-collective:extra@3:1", words=("distributed timeout",))
debug_hang("wrong-collective", d, 1, ("all_reduce", 3))

rc, _, log, d = job("slow_data", ["--inject-fault", "slow-data:ms=400@2:1", "--timing-log-level", "2"])
check(rc == 0, f"slow-data: exit {rc}\n{log[-2000:]}")
bg = {r: [x for x in map(json.loads, open(os.path.join(d, f"metrics.rank_{r}.jsonl"))) if x.get("event") == "train"
          and x.get("iteration") == 2] for r in (0, 1)}
t1 = bg[1][0]["timers_ms"].get("batch-generator", 0) if bg[1] else 0
t0 = bg[0][0]["timers_ms"].get("batch-generator", 0) if bg[0] else 0
# 2 microbatches per DP rank, each sleeps 400 ms on rank 1: the timer's step total >= 800 ms; rank 0 builds a
# microbatch in well under 100 ms
check(t1 >= 800 and t0 < 100, f"slow-data: batch-generator ms at iteration 2: rank 1 {t1}, rank 0 {t0}")

rc, _, log, d = job("slow_rank", ["--inject-fault", "slow-rank:ms=400@2:1"])
check(rc == 0, f"slow-rank: exit {rc}")
r1 = [x for x in map(json.loads, open(os.path.join(d, "metrics.rank_1.jsonl"))) if x.get("iteration") == 2
      and x.get("event") == "train"]
check(r1 and r1[0]["step_ms"][0] >= 400, f"slow-rank: rank 1's step at iteration 2: {r1}")

rc, _, log, d = job("bad_shard", ["--inject-fault", "bad-shard@4:1", "--save-interval", "2", "--train-iters", "4"])
check(rc == 0, f"bad-shard: the save run failed: exit {rc}\n{log[-2000:]}")
rc, secs, log, _ = job("bad_shard_load", ["--load", d, "--train-iters", "6"])
errs = [l for l in log.splitlines() if l.startswith("error:")]
check(rc != 0 and errs and "rank_00001" in errs[0] and "checksum" in errs[0].lower(),
      f"bad-shard: the load did not name the corrupted shard: rc {rc}, {errs[:2]}\n{log[-1500:]}")

# --check-collectives with pipeline P2P (the send/recv fingerprints): a healthy PP2 run is unchanged
a, _ = train("pp2_plain", 2, ["--pipeline-model-parallel-size", "2"])
b, _ = train("pp2_checked", 2, ["--pipeline-model-parallel-size", "2", "--check-collectives"])
check(losses(a) and losses(a) == losses(b), f"--check-collectives changed PP2's losses: {losses(b)} vs {losses(a)}")

if failures:
    print("\n\n".join(failures))
    sys.exit(1)
print("diagnosis checks passed")
