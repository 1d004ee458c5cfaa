#!/usr/bin/env python3
"""ctest experiments.EXX_oracle_fails (and EXX_<tier>_smoke_oracle_fails): `experiments/run EXX --broken --repeats 1
[run flags]` must exit 1 with an oracle.json whose verdict is "fail" and whose failing checks are the oracle's (not a
run that crashed): each recipe's oracle shown failing on its deliberately wrong input (issue 34).
usage: check_broken.py EXX MCPP RESULTS_DIR [experiments/run flags, e.g. --tier gpu --smoke]"""
import json
import os
import subprocess
import sys

exp, mcpp, results = sys.argv[1:4]
run = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run")
p = subprocess.run([sys.executable, run, exp, "--broken", "--repeats", "1", "--mcpp", mcpp, "--results", results,
                    *sys.argv[4:]], capture_output=True, text=True)
out = next((l.split("results in ", 1)[1].strip() for l in p.stdout.splitlines() if "results in " in l), None)
if p.returncode != 1 or not out or not out.endswith("-broken"):
    sys.exit(f"expected exit 1 and a -broken result, got exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
o = json.load(open(os.path.join(out, "oracle.json")))
failed = [c["name"] for c in o["checks"] if c["pass"] is False]
if o["verdict"] != "fail" or not failed or failed == ["runs"]:
    sys.exit(f"the oracle did not fail on broken input: {o}")
print(f"{exp}: oracle fails on broken input as it must: {failed}")
