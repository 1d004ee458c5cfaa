#!/usr/bin/env python3
"""`mcpp data samples` against the Python oracle of Megatron-Core's GPTDataset sample order
(megatron_gpt_indices.py: split bookends, document / sample / shuffle indices, numpy's RandomState).

usage: samples_check.py MCPP WORKDIR
  A dataset of 517 documents (the split-boundary example: 969,30,1 puts train at [0, 501)) written with the
  independent Megatron-layout writer; for each split, several seeds, seq lengths and sample counts, `mcpp data
  samples --json` returns the oracle's samples at chosen indices; the text form prints the same ids; with a
  tokenizer the text is the tokenizer's decode of them; bad requests exit 2 with one 'error:' line.
"""
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from megatron_indexed_writer import write  # noqa: E402

MCPP, WORK = sys.argv[1], sys.argv[2]
ORACLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "megatron_gpt_indices.py")
os.makedirs(WORK, exist_ok=True)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


rnd = random.Random(3)
docs = [[[rnd.randrange(1, 50000) for _ in range(rnd.randrange(1, 40))] + [50256]] for _ in range(517)]
prefix = os.path.join(WORK, "d")
write(prefix, 8, docs)

for split_name, k in (("train", 0), ("valid", 1), ("test", 2)):
    for seq, num, seed in ((16, 0, 1234), (7, 3000, 5), (33, 100, 42)):
        if k == 2 and num == 3000:
            continue
        ref = json.loads(subprocess.run([sys.executable, ORACLE, prefix, "969,30,1", str(k), str(seq), str(num),
                                         str(seed)], capture_output=True, text=True, check=True).stdout)
        n = len(ref["samples"])
        idx = sorted({0, n // 2, max(0, n - 2)})
        for i in idx:
            p = subprocess.run([MCPP, "data", "samples", "--data-path", prefix, "--seq-length", str(seq),
                                "--split", "969,30,1", "--split-name", split_name, "--seed", str(seed),
                                "--num-samples", str(num), "--index", str(i), "--count", str(min(2, n - i)), "--json"],
                               capture_output=True, text=True)
            check(p.returncode == 0, f"{split_name} seq {seq}: exit {p.returncode} {p.stderr}")
            if p.returncode:
                continue
            got = json.loads(p.stdout)
            check(got["size"] == n, f"{split_name} seq {seq} num {num}: size {got['size']} vs the oracle's {n}")
            for s in got["samples"]:
                check(s["tokens"] == ref["samples"][s["index"]],
                      f"{split_name} seq {seq} num {num} seed {seed}: sample {s['index']} differs from Megatron's")

# the text form and a tokenizer's text
p = subprocess.run([MCPP, "data", "samples", "--data-path", prefix, "--seq-length", "16", "--index", "3",
                    "--tokenizer-type", "GPT2BPETokenizer"], capture_output=True, text=True)
ref = json.loads(subprocess.run([sys.executable, ORACLE, prefix, "969,30,1", "0", "16", "0", "1234"],
                                capture_output=True, text=True, check=True).stdout)["samples"][3]
lines = p.stdout.splitlines()
check(p.returncode == 0 and lines and lines[0].split(":", 1)[1].split() == [str(t) for t in ref],
      f"text form: {p.stdout[:200]!r}")
dec = subprocess.run([MCPP, "tokenize", "--decode"], input=" ".join(map(str, ref)).encode(), capture_output=True)
check(len(lines) == 2 and lines[1] == "text: " + json.dumps(dec.stdout.decode("utf-8", "replace"), ensure_ascii=False),
      f"text line {lines[1:]!r}")

for args, needle in ((["--index", "100000"], "has samples [0,"), (["--index", "0", "--split-name", "dev"], "train, valid or test"),
                     (["--index", "0", "--split", "1,0,0", "--split-name", "valid"], "leaves the valid split empty"),
                     (["--index", "-1"], "--index -1")):
    p = subprocess.run([MCPP, "data", "samples", "--data-path", prefix, "--seq-length", "16", *args],
                       capture_output=True, text=True)
    err = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode == 2 and len(err) == 1 and err[0].startswith("error:") and needle in err[0],
          f"{args}: want one error line with {needle!r}, got {p.returncode} {p.stderr!r}")

print("OK" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
