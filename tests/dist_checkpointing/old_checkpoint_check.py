#!/usr/bin/env python3
"""Checkpoints saved by an older build (tests/fixtures/ckpt_v1, commit d5a5de5) still verify, load and continue
exactly as the uninterrupted runs that saved them (expected.json):

1. gpt_tp2 (TP2 + SP + distributed optimizer) resumed on 2 ranks in its own layout: iterations 3-4 lm loss and
   grad norm bit for bit.
2. gpt_tp2 resumed on 1 rank (resharded TP2 -> TP1): the same within 1e-6 relative (TP changes summation order).
3. deepseek_tiny (MLA + YaRN, MoE with a shared expert and expert bias, MTP) resumed on 1 rank: bit for bit.
4. `mcpp ckpt verify` accepts both.
usage: old_checkpoint_check.py MCPP_BIN WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

MCPP, WORK = sys.argv[1], sys.argv[2]
FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "ckpt_v1")
shutil.rmtree(WORK, ignore_errors=True)
shutil.copytree(FIX, WORK)  # a run must not write into the committed fixture
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
MPI = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
expected = json.load(open(os.path.join(WORK, "expected.json")))
failures = []

COMMON = ("--seq-length 16 --max-position-embeddings 16 --micro-batch-size 2 --global-batch-size 4 "
          "--tokenizer-type NullTokenizer --vocab-size 128 --make-vocab-size-divisible-by 32 --train-iters 4 --lr 1e-3 "
          "--lr-warmup-iters 1 --lr-decay-style cosine --log-interval 1 --eval-iters 0 --split 100,0,0 --device cpu "
          "--seed 7").split() + ["--data-path", os.path.join(WORK, "data")]
GPT = "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --hidden-dropout 0 --attention-dropout 0".split()
DS = ["--config", os.path.join(WORK, "deepseek_tiny.toml")] + (
    "--num-layers 2 --moe-layer-freq [0]+[1]*1 --hidden-size 32 --num-attention-heads 4 "
    "--original-max-position-embeddings 8 --num-experts 4 --moe-router-num-groups 2 --moe-router-group-topk 1").split()


def run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    if p.returncode != 0:
        failures.append(f"{what}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def resumed(name, flags, prefix, what):
    metrics = os.path.join(WORK, what + ".jsonl")
    run(prefix + [MCPP, "train", *flags, *COMMON, "--load", os.path.join(WORK, name), "--metrics-path", metrics], what)
    if not os.path.exists(metrics):
        return {}
    return {str(r["iteration"]): r for r in map(json.loads, open(metrics)) if r.get("event") == "train"}


def compare(name, got, rel, what):
    for it, want in expected[name].items():
        row = got.get(it)
        if row is None:
            failures.append(f"{what}: no train record for iteration {it}")
            continue
        for key in ("lm_loss", "grad_norm"):
            a, b = row[key], want[key]
            if (a != b) if rel == 0 else abs(a - b) > rel * abs(b):
                failures.append(f"{what}: iteration {it} {key} {a!r} vs saved run {b!r} (tolerance {rel})")


DIST = ["--use-distributed-optimizer"]
compare("gpt_tp2", resumed("gpt_tp2", GPT + DIST + ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
                           MPI, "gpt_tp2_np2"), 0, "gpt_tp2 resumed at TP2")
compare("gpt_tp2", resumed("gpt_tp2", GPT + DIST, [], "gpt_tp2_np1"), 1e-6, "gpt_tp2 resumed at TP1")
compare("deepseek_tiny", resumed("deepseek_tiny", DS, [], "deepseek_np1"), 0, "deepseek_tiny resumed")
for name in ("gpt_tp2", "deepseek_tiny"):
    run([MCPP, "ckpt", "verify", os.path.join(WORK, name)], f"ckpt verify {name}")

for f in failures:
    print("FAIL:", f)
print("old checkpoint fixtures:", "FAILED" if failures else "OK")
sys.exit(1 if failures else 0)
