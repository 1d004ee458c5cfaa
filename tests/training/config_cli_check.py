#!/usr/bin/env python3
"""Bad configuration values through the real CLI (`mcpp train`): each exits 2 with ONE line "error: ..." that names
the flag, key or file — never saturated, never training NaNs, never hanging (issue 38 items 7-8):
non-finite float flags (inf, nan, 1e400 and floats beyond a float's range), integers beyond int64, floats outside
their declared range, TOML values that are not finite or of the wrong type, a --config that is a directory or a
FIFO (which would block a reader).
usage: config_cli_check.py MCPP_BIN WORKDIR
"""
import os
import shutil
import subprocess
import sys

MCPP, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)


def toml(name, text):
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        f.write(text)
    return path


fifo = os.path.join(WORK, "recipe.fifo")
os.mkfifo(fifo)
CASES = [
    (["--adam-eps", "inf"], "--adam-eps: inf is not a finite number"),
    (["--weight-decay", "1e400"], "--weight-decay: 1e400 is not a finite number"),
    (["--init-method-std", "nan"], "--init-method-std: nan is not a finite number"),
    (["--norm-epsilon", "1e39"], "--norm-epsilon: 1e39 is not a finite number"),
    (["--hidden-size", "99999999999999999999"], "--hidden-size: 99999999999999999999 is out of range (a 64-bit integer)"),
    (["--train-iters", "-99999999999999999999"], "is out of range (a 64-bit integer)"),
    (["--hidden-dropout", "1"], "hidden_dropout must be in [0, 1), got 1"),
    (["--adam-beta1", "-0.1"], "adam_beta1 must be in [0, 1), got -0.1"),
    (["--norm-epsilon", "0"], "norm_epsilon must be positive, got 0"),
    (["--config", toml("inf.toml", "[optimizer]\nadam_eps = inf\n")], "optimizer.adam_eps: expected a finite number"),
    (["--config", toml("type.toml", "[model]\nnum_layers = \"4\"\n")], "model.num_layers: expected an integer"),
    (["--config", toml("big.toml", "[model]\ninit_method_std = 1e300\n")], "model.init_method_std: 1e+300 is out of range"),
    (["--config", WORK], f"--config file {WORK} is a directory, not a regular file"),
    (["--config", fifo], f"--config file {fifo} is a FIFO, not a regular file"),
]
failures = []
for args, want in CASES:
    try:
        p = subprocess.run([MCPP, "train", *args], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        failures.append(f"{args}: hung")
        continue
    lines = p.stderr.strip().splitlines()
    ok = p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0]
    print(f"{'ok  ' if ok else 'FAIL'} {' '.join(args)} -> exit {p.returncode}: {p.stderr.strip()}")
    if not ok:
        failures.append(f"{args}: exit {p.returncode}, stderr {p.stderr!r}; expected one error line with {want!r}")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
