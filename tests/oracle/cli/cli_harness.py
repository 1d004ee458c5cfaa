"""Shared preamble of the multi-rank mcpp CLI checks (tests/oracle/cli/parallel_train_check.py,
pipeline_train_check.py; tests/dist_checkpointing/dcp_{matrix,pp_matrix,async}_check.py).

    from cli_harness import MCPP, WORK, ENV, MPI, failures, run, losses

MCPP / WORK come from argv[1:3]; WORK is emptied. ENV runs mpiexec as root with one OpenMP thread per
rank. run(cmd, np_=None, expect=0, env=None, timeout=400) runs cmd (under `mpiexec -np np_` when np_ is
given; env entries added to ENV) and records a failure (command, exit code, output tails) when the exit
status disagrees with `expect` (0: success, nonzero: failure, None: not checked) instead of raising, so a
check reports every problem at once; each script prints `failures` and exits 1 when any.
losses(d): {iteration: lm_loss} of the train records in d/metrics.jsonl ({} when there is none).
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
MPI = ["mpiexec", "--allow-run-as-root", "--oversubscribe"]
failures = []


def run(cmd, np_=None, expect=0, env=None, timeout=400):
    if np_ is not None:
        cmd = MPI + ["-np", str(np_)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, **(env or {})}, timeout=timeout)
    if expect is not None and (expect == 0) != (p.returncode == 0):
        failures.append(f"{' '.join(cmd[:12])}...: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def losses(d):
    p = os.path.join(d, "metrics.jsonl")
    if not os.path.exists(p):
        return {}
    return {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(p)) if r.get("event") == "train"}
