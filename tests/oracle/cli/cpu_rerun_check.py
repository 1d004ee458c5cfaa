"""training.cpu_rerun_cli: --rerun-on-cpu (docs/DEBUGGING.md; issue 33): a faulty step also re-runs in fp32 on CPU from
the step's checkpoint or the pre-step state, and the incident says whether the fault reproduces there.

The oracle for the CPU re-run is the trainer's own same-rank re-run: on CPU ranks both run the same step on the same
weights, batch and dropout streams, so a healthy (transient) one gives the same loss and grad norm, and a numerics
fault (an overflow from --lr 1e30) the same first non-finite module and tensor. An injected NaN stands for a device
fault and does not follow the step to the CPU.

A. One rank:
   one-off nan-grad@3 (no checkpoint): cpu_fp32 "finite", from the pre-step state ("no checkpoint"), its loss and
   grad norm equal the same-rank re-run's; a {"event": "cpu_rerun"} metric; the log line; training afterwards equals
   the same run without --rerun-on-cpu (the CPU re-run leaves the trainer as it was).
   persistent nan-grad@3 with --save-interval 2: reproducible on the device, cpu_fp32 "finite" (a device fault), read
   from the checkpoint iter_0000002.
   --lr 1e30 --save-interval 2 (the weights overflow at iteration 3): cpu_fp32 "non-finite at" the same module and
   tensor as the same-rank re-run names, from the checkpoint, classified a numerics problem.
   --check-for-spiky-loss --spiky-loss-factor 0.5: the CPU loss spikes again (reproduces).
B. Two ranks (each rank re-runs its slice in the same layout):
   TP2 --lr 1e30: the same culprit (rank, module, tensor) as the same-rank re-run; rank 0's own finding in its
   per-rank metrics ({"event": "cpu_rerun_finding"}).
   DP2 --use-distributed-optimizer, bad-shard@2:1 + one-off nan-output@3:0 (--save-interval 2): the checkpoint read
   fails (checksum), every rank falls back to the pre-step state; finite, grad norm = the re-run's.
   PP2 --lr 1e30 --train-iters 4 --save-interval 2: iteration 3 from the checkpoint, iteration 4 from the pre-step
   state (the checkpoint holds iteration 2); the culprit equals the same-rank re-run's.
C. Flags: --rerun-on-cpu without a trigger, or with --enable-cuda-graph: exit 2, one error line naming rerun_on_cpu.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from cli_harness import MCPP, WORK, close, failures, losses, record_corpus, records, run, tiny_train_flags  # noqa: E402

DATA = record_corpus()
BASE = tiny_train_flags(DATA)


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def train(name, np_, extra):
    d = os.path.join(WORK, name)
    p = run([MCPP, "train", *BASE, *extra, "--save", d], np_=np_)
    return d, p.stdout + p.stderr


def incidents(d):
    return {r["iteration"]: r for r in records(d, "rerun_incident")}


def culprit(f):
    f = f or {}
    return (f.get("rank"), f.get("module"), f.get("tensor"), f.get("layer"), f.get("microbatch"))


def check_healthy_cpu(what, inc, state):
    """A device-only fault: the CPU re-run is finite and (the same step, weights, batch) equals a healthy re-run."""
    c = inc.get("cpu_rerun", {})
    check(inc.get("cpu_fp32") == "finite" and c.get("first_non_finite") is None and c.get("ranks") == [],
          f"{what}: cpu_fp32 {inc.get('cpu_fp32')!r}: {c}")
    check(c.get("classification", "").startswith("device or precision fault"), f"{what}: classification {c}")
    check(c.get("state") == state, f"{what}: state {c.get('state')!r} != {state!r}: {c}")


# ---------------- A. one rank
d, log = train("oneoff", None, ["--rerun-on-cpu", "--inject-fault", "nan-grad:layer=0@3"])
inc = incidents(d).get(3, {})
check_healthy_cpu("one-off", inc, "pre-step state")
c = inc.get("cpu_rerun", {})
check("no checkpoint" in c.get("why_state", ""), f"one-off: why_state {c.get('why_state')!r}")
# The same kernels, layout, weights and batch: equal up to the summation order (bit-equal on one rank today)
check(inc.get("classification") == "transient" and close(c.get("loss"), inc.get("rerun_loss"), 1e-6)
      and close(c.get("grad_norm"), inc.get("rerun_grad_norm"), 1e-6),
      f"one-off: the CPU re-run's loss / grad norm {c.get('loss')} / {c.get('grad_norm')} != the same-rank re-run's "
      f"{inc.get('rerun_loss')} / {inc.get('rerun_grad_norm')}")
check("[rerun] iteration 3: cpu_fp32: finite" in log and "not reproducible in fp32 on CPU" in log,
      f"one-off: no cpu_fp32 log line:\n{log[-2000:]}")
m = records(d, "cpu_rerun")
check(len(m) == 1 and m[0].get("iteration") == 3 and m[0].get("reproduces") is False and m[0].get("ms", 0) > 0,
      f"one-off: the cpu_rerun metric {m}")
check(json.load(open(os.path.join(d, "metrics.incident_iter3.json"))) == inc, "one-off: incident file != the record")
plain, _ = train("oneoff_plain", None, ["--inject-fault", "nan-grad:layer=0@3"])
got, want = losses(d), losses(plain)
check(sorted(got) == list(range(1, 7)) and all(got[i] == want.get(i) for i in got),
      f"--rerun-on-cpu changed the training: {got} vs {want}")

d, log = train("persistent", None, ["--rerun-on-cpu", "--save-interval", "2", "--inject-fault",
                                    "nan-grad:layer=1,persistent@3"])
inc = incidents(d).get(3, {})
check(inc.get("classification") == "reproducible" and culprit(inc.get("first_non_finite"))[1] == "decoder.layers.1.mlp",
      f"persistent: the same-rank re-run: {inc}")
check_healthy_cpu("persistent", inc, "checkpoint")
check(inc.get("cpu_rerun", {}).get("checkpoint", "").endswith("iter_0000002"), f"persistent: {inc.get('cpu_rerun')}")
check("re-ran from the checkpoint" in log, "persistent: the log does not say the checkpoint was used")


def check_numerics(what, inc, state):
    c = inc.get("cpu_rerun", {})
    want = culprit(inc.get("first_non_finite"))
    check(want[1] is not None and culprit(c.get("first_non_finite")) == want
          and inc.get("cpu_fp32") == f"non-finite at {want[1]} {want[2]}",
          f"{what}: the CPU re-run's first non-finite {c.get('first_non_finite')} / {inc.get('cpu_fp32')!r} != the "
          f"same-rank re-run's {inc.get('first_non_finite')}")
    check(c.get("classification", "").startswith("numerics problem") and c.get("state") == state,
          f"{what}: classification / state {c.get('classification')!r} / {c.get('state')!r} (want {state!r})")


d, log = train("lr_overflow", None, ["--rerun-on-cpu", "--lr", "1e30", "--train-iters", "3", "--save-interval", "2"])
inc = incidents(d).get(3, {})
check_numerics("lr 1e30", inc, "checkpoint")
check("[rerun] iteration 3: cpu_fp32: non-finite at" in log and "reproducible in fp32 on CPU" in log,
      f"lr 1e30: no cpu_fp32 log line:\n{log[-2000:]}")

d, _ = train("spiky", None, ["--rerun-on-cpu", "--check-for-spiky-loss", "--spiky-loss-factor", "0.5",
                             "--train-iters", "3"])
inc = incidents(d).get(2, {})
check(inc.get("trigger") == "spiky_loss" and inc.get("cpu_fp32") == "finite, the loss spikes again"
      and inc.get("cpu_rerun", {}).get("classification", "").startswith("numerics problem"),
      f"spiky: {inc.get('cpu_fp32')!r} {inc.get('cpu_rerun')}")

# ---------------- B. two ranks
d, _ = train("tp2_lr", 2, ["--rerun-on-cpu", "--tensor-model-parallel-size", "2", "--lr", "1e30", "--train-iters",
                           "3"])
check_numerics("TP2 lr 1e30", incidents(d).get(3, {}), "pre-step state")
mine = [r for r in map(json.loads, open(os.path.join(d, "metrics.rank_0.jsonl")))
        if r.get("event") == "cpu_rerun_finding"]
check(mine and mine[0].get("iteration") == 3 and mine[0].get("rank") == 0,
      f"TP2 lr 1e30: rank 0's per-rank metrics hold no cpu_rerun_finding: {mine}")

d, log = train("dp2_badshard", 2, ["--rerun-on-cpu", "--use-distributed-optimizer", "--save-interval", "2",
                                   "--inject-fault", "bad-shard@2:1", "--inject-fault", "nan-output:layer=0@3:0"])
inc = incidents(d).get(3, {})
check_healthy_cpu("DP2 bad shard", inc, "pre-step state")
c = inc.get("cpu_rerun", {})
check("checksum" in c.get("why_state", ""), f"DP2 bad shard: why_state {c.get('why_state')!r}")
# plain DDP's all-reduce vs the distributed optimizer's reduce-scatter + sharded norm: the last bits may differ
check(close(c.get("grad_norm"), inc.get("rerun_grad_norm"), 1e-6) and close(c.get("loss"), inc.get("rerun_loss"), 1e-6),
      f"DP2 bad shard: {c.get('loss')} / {c.get('grad_norm')} vs {inc.get('rerun_loss')} / {inc.get('rerun_grad_norm')}")

d, _ = train("pp2_lr", 2, ["--rerun-on-cpu", "--pipeline-model-parallel-size", "2", "--lr", "1e30", "--train-iters",
                           "4", "--save-interval", "2"])
incs = incidents(d)
check(sorted(incs) == [3, 4], f"PP2: incidents at {sorted(incs)}")
check_numerics("PP2 iteration 3", incs.get(3, {}), "checkpoint")
check_numerics("PP2 iteration 4", incs.get(4, {}), "pre-step state")
check("holds iteration 2" in incs.get(4, {}).get("cpu_rerun", {}).get("why_state", ""),
      f"PP2 iteration 4: {incs.get(4, {}).get('cpu_rerun')}")

# ---------------- C. flags
for extra in (["--no-check-for-nan-in-loss-and-grad"], ["--enable-cuda-graph"]):
    p = run([MCPP, "train", *BASE, "--rerun-on-cpu", *extra, "--save", os.path.join(WORK, "bad")], expect=1)
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    check(p.returncode == 2 and len(errs) == 1 and "rerun_on_cpu" in errs[0], f"--rerun-on-cpu {extra}: {p.returncode} {errs}")

if failures:
    print("\n\n".join(failures))
    sys.exit(1)
print("cpu re-run checks passed")
