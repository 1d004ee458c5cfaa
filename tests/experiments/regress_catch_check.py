#!/usr/bin/env python3
"""ctest bench.regress_counters_catch: the counter gate must catch a deliberate extra all-reduce.
`bench/regress counters --extra-flags "--ddp-bucket-size 20000"` splits the plain-DP case's 34688-element gradient
buffer into two buckets: one more all-reduce of the same total. The gate must exit 1 and name exactly that counter.
usage: regress_catch_check.py MCPP"""
import os
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
p = subprocess.run([sys.executable, os.path.join(root, "bench", "regress"), "counters", "--mcpp", sys.argv[1],
                    "--extra-flags", "--ddp-bucket-size 20000"], capture_output=True, text=True)
want = "REGRESSION /dp2_plain/collectives/rank0:all_reduce dp_cp: baseline [1, 34688], now [2, 34688]"
if p.returncode != 1 or want not in p.stdout:
    sys.exit(f"the gate did not catch the extra all-reduce (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-1000:]}")
print("caught:", want)
