#!/usr/bin/env python3
"""`mcpp launch --nproc-per-node N -- train ...` (no MPI; comm/tcp) against one process.

1. TP2 x PP2 on 4 ranks and TP2 + SP x DP2 + distributed optimizer on 4 ranks: per-iteration lm loss equal
   to the single-process run within 1e-5 relative (fp32; TP splits change summation order only).
2. One rank SIGKILLed during a checkpoint save (MCPP_FAULT_KILL_AT, rank 1 only): the launcher names the
   rank and signal, stops the others, and exits non-zero within the timeout (no hang).
3. The launcher SIGKILLed mid-run (a killed scheduler job step): no rank survives it (PR_SET_PDEATHSIG).
4. Usage errors (no '--', unknown subcommand, --nproc-per-node 0) exit 2 with one error line.
usage: launch_check.py MCPP_BIN WORKDIR
"""
import json
import os
import subprocess
import time

from cli_harness import MCPP as mcpp, WORK as work, launcher_model, random_tokens

env = dict(os.environ, OMP_NUM_THREADS="1")
model = launcher_model(random_tokens(), layers=4)


def losses(name, prefix, extra):
    path = os.path.join(work, name + ".jsonl")
    p = subprocess.run(prefix + ["train", *model, "--metrics-path", path, *extra], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, f"{name}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return [json.loads(l)["lm_loss"] for l in open(path) if '"event":"train"' in l]


ref = losses("single", [mcpp], [])
launch4 = [mcpp, "launch", "--nproc-per-node", "4", "--"]
for name, extra in [("tp2pp2", ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
                    ("tp2sp_dp2_distopt", ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                           "--use-distributed-optimizer", "--overlap-grad-reduce"])]:
    got = losses(name, launch4, extra)
    err = max(abs(a - b) / abs(a) for a, b in zip(ref, got))
    assert len(got) == len(ref) == 4 and err < 1e-5, (name, ref, got, err)
    print(f"{name}: max rel loss diff vs 1 process {err:.2e}")

# A rank killed mid-save: the job ends (no hang), the launcher names it.
t0 = time.time()
kenv = dict(env, MCPP_FAULT_KILL_AT="after_fsync_model", MCPP_FAULT_KILL_RANK="1")
p = subprocess.run([mcpp, "launch", "--nproc-per-node", "2", "--", "train", *model, "--save",
                    os.path.join(work, "ckpt"), "--distributed-timeout-minutes", "1"], env=kenv, capture_output=True,
                   text=True, timeout=200)
assert p.returncode != 0, p.stderr[-2000:]
assert "rank 1 was killed by signal 9" in p.stderr, p.stderr[-2000:]
print(f"killed rank: launch exit {p.returncode} after {time.time() - t0:.1f} s")


def children(pid):  # every descendant of pid (from /proc)
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# The launcher SIGKILLed while its ranks train (long enough not to finish): the ranks die with it.
long_run = [mcpp, "launch", "--nproc-per-node", "2", "--", "train", *model, "--train-iters", "100000",
            "--tensor-model-parallel-size", "2"]
launcher = subprocess.Popen(long_run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
ranks = []
deadline = time.time() + 60
while time.time() < deadline and len(ranks) < 2:
    time.sleep(0.2)
    ranks = [p for p in children(launcher.pid) if alive(p)]
assert len(ranks) == 2, f"launcher {launcher.pid} has ranks {ranks}"
time.sleep(1.0)  # ranks past their start-up, in the rendezvous / training
launcher.kill()
launcher.wait()
deadline = time.time() + 10
while time.time() < deadline and any(alive(p) for p in ranks):
    time.sleep(0.1)
left = [p for p in ranks if alive(p)]
for p in left:  # clean up before failing
    os.kill(p, 9)
assert not left, f"ranks {left} outlived their SIGKILLed launcher"
print(f"launcher SIGKILLed: its {len(ranks)} ranks died with it")

for args, needle in [([mcpp, "launch", "--nproc-per-node", "2", "train"], "after '--'"),
                     ([mcpp, "launch", "--nproc-per-node", "2", "--", "nosuch"], "nosuch"),
                     ([mcpp, "launch", "--nproc-per-node", "0", "--", "train"], "nproc_per_node")]:
    q = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert q.returncode == 2 and needle in q.stderr and q.stderr.count("\n") == 1, (args, q.returncode, q.stderr)
print("launch OK")
