"""Shared preamble of the multi-rank mcpp CLI checks (parallel_train_check.py, pipeline_train_check.py).

    from cli_harness import MCPP, WORK, ENV, MPI, failures, run

MCPP / WORK come from argv[1:3]; WORK is emptied. ENV runs mpiexec as root with one OpenMP thread per
rank. run(cmd, expect=0) records a failure (command, exit code, output tails) instead of raising, so a
check reports every problem at once; each script prints `failures` and exits 1 when any.
"""
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


def run(cmd, expect=0, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)
    if (expect == 0) != (p.returncode == 0):
        failures.append(f"{' '.join(cmd[:8])}...: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p
