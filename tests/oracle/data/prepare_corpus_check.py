#!/usr/bin/env python3
"""Checks scripts/prepare_corpus.sh on a small fortunes directory.

usage: prepare_corpus_check.py MCPP_BIN WORKDIR
The directory holds two real fortune files (one without a final newline or "%"), their .dat files,
a .u8 symlink and another symlink duplicate. Expected: only the two real files are concatenated; the
indexed dataset holds one document per non-blank fortune, each ending in EOD (50256); a second run
does nothing ("up to date"); touching an input makes it rebuild.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from megatron_indexed_writer import read  # noqa: E402

MCPP, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts", "prepare_corpus.sh")
shutil.rmtree(WORK, ignore_errors=True)
fdir, ddir = os.path.join(WORK, "fortunes"), os.path.join(WORK, "data")
os.makedirs(fdir)
files = {"alpha": "First fortune.\n%\nSecond\n  -- two lines\n%\n\n%\nThird.\n%\n",
         "beta": "Beta one.\n%\nBeta two, no trailing newline"}
for name, text in files.items():
    open(os.path.join(fdir, name), "w").write(text)
    open(os.path.join(fdir, name + ".dat"), "wb").write(b"\x00\x00\x00\x02binary index")
    os.symlink(name, os.path.join(fdir, name + ".u8"))
os.symlink("alpha", os.path.join(fdir, "alpha-duplicate"))
env = dict(os.environ, FORTUNES_DIR=fdir, DATA_DIR=ddir, MCPP=MCPP)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run():
    return subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True)


r = run()
check(r.returncode == 0, f"first run exit {r.returncode}: {r.stderr}")
prefix = os.path.join(ddir, "fortunes_text_document")
check(f"use --data-path {prefix}" in r.stdout, "prints the --data-path prefix")
expected = []
for name in sorted(files):
    for d in files[name].split("%\n"):
        if d.strip():
            expected.append(d if d.endswith("\n") else d + "\n")
code, doc_idx, seqs = read(prefix)
check(code == 8, f"dtype code {code} (expected 8 = uint16)")
check(len(doc_idx) - 1 == len(expected), f"{len(doc_idx) - 1} documents, expected {len(expected)}")
for k, s in enumerate(seqs):
    check(len(s) > 1 and s[-1] == 50256, f"document {k} ends with EOD")
    text = subprocess.run([MCPP, "tokenize", "--decode"], input=" ".join(map(str, s[:-1])), capture_output=True,
                          text=True).stdout
    if k < len(expected):
        check(text == expected[k], f"document {k} decodes to {text!r}, expected {expected[k]!r}")

r = run()
check(r.returncode == 0 and "up to date" in r.stdout, f"second run is a no-op: {r.stdout!r}")
os.utime(os.path.join(fdir, "beta"), None)
os.utime(prefix + ".idx", (0, 0))  # make the outputs older than the touched input
r = run()
check(r.returncode == 0 and "up to date" not in r.stdout, "a newer input rebuilds")

print("OK" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
