#!/usr/bin/env python3
"""Bad input to the CLI is one named error, never a crash, a hang, a silent default or std::bad_alloc (issue 38).

1. Help: `mcpp help` lists the commands; `mcpp <cmd> --help` of each, and of each sub-subcommand its help lists
   (`mcpp ckpt verify --help`), exits 0 and prints a usage text.
2. Named errors, each exit 2 with one `error:` line naming the problem, within seconds: --temperature nan;
   `ckpt verify --iteration -1`; absurd sizes on CPU (--num-layers 1000000, --hidden-size 1e9 as an integer)
   refused by the memory plan against the host; a manifest re-sealed with a negative consumed_train_samples
   (train --load), with a tensor claiming 2^40 elements (ckpt export), with a 100,000-deep meta (info, verify,
   train --load); a FIFO as manifest.json / tracker (info, verify, train --load) and as the dataset's .idx; a corpus
   line nesting 100,000 deep (data preprocess).
3. `mcpp forward` on 1,000 sequences runs in batches: the logits [1000, s, V] equal those of --batch-size 1000 and of
   a one-sequence run within 1e-5 (fp32 on CPU; only the GEMM blocking differs with the batch).
usage: robustness_check.py MCPP_BIN WORKDIR
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ckpt"))
import manifest_checksum  # noqa: E402

MCPP, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
DATA = os.path.join(HERE, "..", "..", "fixtures", "ckpt_v1", "data")
failures = []


def run(args, timeout=120, **kw):
    return subprocess.run([MCPP, *args], capture_output=True, text=True, env=ENV, timeout=timeout, **kw)


# 1. --help everywhere
p = run(["help"])
commands = re.findall(r"^  (\S+)\s", p.stdout, re.M)
if p.returncode != 0 or len(commands) < 8:
    failures.append(f"mcpp help: exit {p.returncode}, commands {commands}")
walked = 0
for cmd in commands:
    q = run([cmd, "--help"])
    if q.returncode != 0 or "sage" not in q.stdout:
        failures.append(f"mcpp {cmd} --help: exit {q.returncode}, stdout {q.stdout[:200]!r} stderr {q.stderr[-300:]!r}")
    walked += 1
    subs = q.stdout.split("Subcommands:", 1)
    for sub in re.findall(r"^  (\S+)\s", subs[1], re.M) if len(subs) == 2 else []:
        r = run([cmd, sub, "--help"])
        if r.returncode != 0 or "sage" not in r.stdout or f"{cmd} {sub}" not in r.stdout:
            failures.append(f"mcpp {cmd} {sub} --help: exit {r.returncode}, stdout {r.stdout[:200]!r}")
        walked += 1
print(f"help: {walked} commands and subcommands print their usage")

# A small checkpoint to damage.
MODEL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--lr", "1e-3", "--eval-iters", "0",
         "--split", "100,0,0", "--data-path", DATA, "--device", "cpu", "--hidden-dropout", "0",
         "--attention-dropout", "0"]
base = os.path.join(WORK, "base")
p = run(["train", *MODEL, "--train-iters", "2", "--save", base])
if p.returncode != 0:
    print("FAIL: base run\n" + p.stderr[-3000:])
    sys.exit(1)
IT = "iter_0000002"


def damaged(name, fn):
    d = os.path.join(WORK, name)
    shutil.copytree(base, d)
    fn(d)
    return d


def reseal(edit):
    def go(d):
        path = os.path.join(d, IT, "manifest.json")
        j = json.load(open(path))
        edit(j)
        manifest_checksum.reseal(j)
        open(path, "w").write(json.dumps(j))
    return go


def negative_samples(j):
    j["meta"]["consumed_train_samples"] = -8


def huge_tensor(j):
    e = next(e for e in j["tensors"] if e["key"] == "embedding.word_embeddings.weight")
    e["global_shape"] = e["local_shape"] = [1 << 20, 1 << 20]
    e["byte_length"] = 4 << 40


def deep_meta(d):
    path = os.path.join(d, IT, "manifest.json")
    text = open(path).read()
    at = text.index('"meta": {') + len('"meta": {')
    open(path, "w").write(text[:at] + '"deep": ' + "[" * 100000 + "]" * 100000 + "," + text[at:])


def fifo(rel):
    def go(d):
        os.remove(os.path.join(d, rel))
        os.mkfifo(os.path.join(d, rel))
    return go


def expect_error(what, args, needles, timeout=60):
    t0 = time.time()
    try:
        q = run(args, timeout=timeout)
    except subprocess.TimeoutExpired:
        failures.append(f"{what}: hung for {timeout} s")
        return
    lines = [l for l in q.stderr.splitlines() if l.startswith("error:")]
    if q.returncode != 2 or len(lines) != 1 or any(n not in lines[0] for n in needles):
        failures.append(f"{what}: exit {q.returncode}, error lines {lines}, want {needles}; stderr {q.stderr[-600:]}")
    else:
        print(f"{what}: {lines[0][:150]} ({time.time() - t0:.1f} s)")


expect_error("--temperature nan", ["generate", "--load", base, "--prompt", "x", "--temperature", "nan"],
             ["--temperature"])
expect_error("ckpt verify --iteration -1", ["ckpt", "verify", base, "--iteration", "-1"], ["--iteration", ">= 0"])
expect_error("--num-layers 1000000", ["train", *MODEL, "--train-iters", "2", "--num-layers", "1000000"],
             ["memory plan", "host"], timeout=30)
expect_error("--hidden-size 1000000000", ["train", *MODEL, "--train-iters", "2", "--hidden-size", "1000000000"],
             ["memory plan", "hidden_size"], timeout=30)
expect_error("--hidden-size 65536", ["train", *MODEL, "--train-iters", "2", "--hidden-size", "65536"],
             ["memory plan", "host"], timeout=30)
d = damaged("negative_samples", reseal(negative_samples))
expect_error("negative consumed_train_samples", ["train", *MODEL, "--train-iters", "3", "--load", d],
             ["meta.consumed_train_samples", "non-negative"])
d = damaged("huge_tensor", reseal(huge_tensor))
expect_error("ckpt export of a 2^40-element tensor", ["ckpt", "export", "--load", d, "--format", "hf-gpt2",
                                                      "--output", os.path.join(WORK, "hf_out")],
             ["embedding.word_embeddings.weight"])
d = damaged("deep_meta", deep_meta)
for args in (["ckpt", "info", d], ["ckpt", "verify", d], ["train", *MODEL, "--train-iters", "3", "--load", d]):
    expect_error(f"100,000-deep meta: {args[0]} {args[1]}", args, ["manifest.json", "nests deeper than 64"])
for rel in (os.path.join(IT, "manifest.json"), "latest_checkpointed_iteration.txt"):
    d = damaged("fifo_" + os.path.basename(rel), fifo(rel))
    for args in (["ckpt", "info", d], ["ckpt", "verify", d], ["train", *MODEL, "--train-iters", "3", "--load", d]):
        expect_error(f"FIFO {os.path.basename(rel)}: {args[0]} {args[1]}", args, [os.path.basename(rel), "FIFO"])
os.makedirs(os.path.join(WORK, "fifo_data"))
shutil.copy(DATA + ".bin", os.path.join(WORK, "fifo_data", "data.bin"))
os.mkfifo(os.path.join(WORK, "fifo_data", "data.idx"))
expect_error("FIFO .idx", ["train", *[a if a != DATA else os.path.join(WORK, "fifo_data", "data") for a in MODEL],
                           "--train-iters", "2"], ["data.idx", "FIFO"])
corpus = os.path.join(WORK, "deep.jsonl")
open(corpus, "w").write('{"text": "fine"}\n{"text": ' + "[" * 100000 + "]" * 100000 + "}\n")
expect_error("corpus line 100,000 deep", ["data", "preprocess", "--input", corpus, "--output-prefix",
                                          os.path.join(WORK, "deep")], ["deep.jsonl:2", "nests deeper than 64"])

# 3. forward on 1,000 sequences
rng = np.random.default_rng(3)
toks = rng.integers(0, 128, size=(1000, 16))
tok_file = os.path.join(WORK, "tokens.txt")
open(tok_file, "w").write("\n".join(" ".join(map(str, r)) for r in toks) + "\n")
open(os.path.join(WORK, "one.txt"), "w").write(" ".join(map(str, toks[0])) + "\n")
outs = {}
for name, extra, src in (("auto", [], tok_file), ("b1000", ["--batch-size", "1000"], tok_file),
                         ("one", [], os.path.join(WORK, "one.txt"))):
    out = os.path.join(WORK, f"logits_{name}.npy")
    q = run(["forward", "--load", base, "--tokens", src, "--output", out, *extra], timeout=300)
    if q.returncode != 0:
        failures.append(f"forward {name}: exit {q.returncode}: {q.stderr[-800:]}")
    else:
        outs[name] = np.load(out)
if len(outs) == 3:
    a, b, one = outs["auto"], outs["b1000"], outs["one"]
    if a.shape != (1000, 16, 128) or b.shape != a.shape:
        failures.append(f"forward: shapes {a.shape} {b.shape}")
    else:
        # tolerance 1e-5 relative: fp32 on CPU; rows are independent, only GEMM blocking changes with the batch
        err = max(float(np.max(np.abs(a - b))), float(np.max(np.abs(a[0] - one[0])))) / float(np.max(np.abs(b)))
        if not err < 1e-5:
            failures.append(f"forward: batched logits differ from one pass by {err:.2e} (relative)")
        print(f"forward: 1000 sequences in batches equal one pass within {err:.1e}")

for f in failures:
    print("FAIL:", f)
print("robustness:", "FAILED" if failures else "OK")
sys.exit(1 if failures else 0)
