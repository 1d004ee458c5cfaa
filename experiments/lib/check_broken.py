#!/usr/bin/env python3
"""ctest experiments.EXX_oracle_fails: `experiments/run EXX --broken --repeats 1` must exit 1 with an oracle.json
whose verdict is "fail" and whose failing checks are the oracle's (not a run that crashed): each recipe's oracle
shown failing on its deliberately wrong input (issue 34).
usage: check_broken.py EXX MCPP RESULTS_DIR"""
import glob
import json
import os
import subprocess
import sys

exp, mcpp, results = sys.argv[1:4]
run = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run")
p = subprocess.run([sys.executable, run, exp, "--broken", "--repeats", "1", "--mcpp", mcpp, "--results", results],
                   capture_output=True, text=True)
dirs = sorted(glob.glob(os.path.join(results, exp, "*-broken")))
if p.returncode != 1 or not dirs:
    sys.exit(f"expected exit 1 and a -broken result, got exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
o = json.load(open(os.path.join(dirs[-1], "oracle.json")))
failed = [c["name"] for c in o["checks"] if not c["pass"]]
if o["verdict"] != "fail" or not failed or failed == ["runs"]:
    sys.exit(f"the oracle did not fail on broken input: {o}")
print(f"{exp}: oracle fails on broken input as it must: {failed}")
