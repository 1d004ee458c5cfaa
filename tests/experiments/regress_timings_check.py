#!/usr/bin/env python3
"""ctest bench.regress_timings: the timing gate's rule and its run, on CPU (the device runs the GPU cases).
1. The rule (bench/regress timing_verdict) on fixed repeats: a step 10% slower is a regression; within the
   baseline's spread (1-2%) it is not; a noisy baseline widens the margin (k x 1.4826 x MAD); faster is named.
2. `bench/regress timings --kind cpu --update` writes a baseline of the tiny case (3 repeats); the same command with
   `--extra-flags "--inject-fault slow-rank:ms=400,every@1"` (every step sleeps 400 ms, many times the tiny step)
   exits 1 naming the case and keeps a timeline of the slow case; bad usage exits 2 with one error line.
usage: regress_timings_check.py MCPP WORK"""
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
regress_path = os.path.join(root, "bench", "regress")
loader = importlib.machinery.SourceFileLoader("regress", regress_path)
spec = importlib.util.spec_from_loader("regress", loader)
regress = importlib.util.module_from_spec(spec)
loader.exec_module(regress)
mcpp, work = sys.argv[1], sys.argv[2]

# 1. the rule
base = [100.0, 101.0, 99.5, 100.4, 100.8]
cases = [([110.2, 110.9, 109.8, 111.0, 110.4], "regression"), ([101.2, 99.9, 101.8, 100.6, 102.0], "ok"),
         ([90.1, 89.7, 90.5, 90.0, 89.9], "faster")]
for now, want in cases:
    v = regress.timing_verdict(base, now)
    assert v["state"] == want, (now, v)
noisy = [100.0, 112.0, 88.0, 104.0, 96.0]  # MAD 4: margin 4 x 1.4826 x 4 = 23.7 ms, so +10% is within it
v = regress.timing_verdict(noisy, [110.0, 111.0, 109.0])
assert v["state"] == "ok" and abs(v["margin_ms"] - 4 * 1.4826 * 4) < 1e-9, v
print("rule ok")

# 2. the run
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
baseline = os.path.join(work, "timings_cpu.json")
env = {**os.environ, "OMP_NUM_THREADS": "1"}


def gate(*args):
    return subprocess.run([sys.executable, regress_path, "timings", "--kind", "cpu", "--mcpp", mcpp, "--baseline",
                           baseline, "--repeats", "3", *args], capture_output=True, text=True, env=env, timeout=600)


p = gate("--update", "--work", os.path.join(work, "w1"))
assert p.returncode == 0 and os.path.exists(baseline), (p.returncode, p.stdout[-1500:], p.stderr[-1500:])
b = json.load(open(baseline))
assert len(b["cases"]["tiny_cpu"]["runs"]) == 3 and b["kind"] == "cpu", b
p = gate("--work", os.path.join(work, "w2"), "--extra-flags", "--inject-fault slow-rank:ms=400,every@1")
trace = os.path.join(work, "w2", "tiny_cpu.timeline.json")
assert p.returncode == 1 and "REGRESSION tiny_cpu" in p.stdout and os.path.exists(trace), \
    (p.returncode, p.stdout[-1500:], p.stderr[-1500:])
print([l for l in p.stdout.splitlines() if l.startswith("REGRESSION")][0])
for args, needle in ((["--repeats", "2"], "--repeats must be >= 3"),
                     (["--baseline", os.path.join(work, "none.json")], "no baseline")):
    q = gate(*args)
    assert q.returncode == 2 and needle in q.stderr and q.stderr.count("\n") == 1, (args, q.returncode, q.stderr)
q = subprocess.run([sys.executable, regress_path, "timings", "--kind", "tpu", "--mcpp", mcpp], capture_output=True,
                   text=True)
assert q.returncode == 2 and "no timing cases for --kind tpu" in q.stderr, (q.returncode, q.stderr)
print("regress timings OK")
