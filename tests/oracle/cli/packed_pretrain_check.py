#!/usr/bin/env python3
"""`mcpp train --reset-position-ids --reset-attention-mask` on EOD-separated pretraining documents (Megatron's
_get_ltor_masks_and_position_ids: a document ends after each EOD token).

Oracle: the first step's loss (lr 0, per-token loss, Llama-style model: RoPE on per-token positions) equals the loss
of every document piece of every sample run ALONE through `mcpp forward` from the saved (unchanged) weights — the
samples' tokens from `mcpp data samples` (GPTDataset's order), each position's label the next token as Megatron's
(the EOD position predicts the next document's first token, unmasked without --eod-mask-loss). Then: without the
flags the loss differs (the documents see each other), and with context parallelism the flags are refused (exit 2).
usage: packed_pretrain_check.py MCPP_BIN WORKDIR
"""
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np

mcpp, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
here = os.path.dirname(os.path.abspath(__file__))
env = dict(os.environ, OMP_NUM_THREADS="1")
V, EOD, S, GBS = 512, 511, 64, 4  # NullTokenizer: EOD = vocab - 1; 512 is its own padded size


def run(*args, check=True):
    p = subprocess.run([mcpp, *args], env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, f"{args[:3]}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    return p


rng = random.Random(1)
docs = [[[rng.randrange(0, EOD) for _ in range(rng.randrange(5, 40))] + [EOD]] for _ in range(300)]
with open(os.path.join(work, "docs.json"), "w") as f:
    json.dump(docs, f)
data = os.path.join(work, "eod")
subprocess.run([sys.executable, os.path.join(here, "..", "megatron_indexed_writer.py"), "write", "--prefix", data,
                "--dtype", "4", "--input", os.path.join(work, "docs.json")], check=True)
model = ["--config", os.path.join(here, "..", "..", "..", "configs", "llama-tiny.toml"), "--seq-length", str(S),
         "--max-position-embeddings", str(S), "--tokenizer-type", "NullTokenizer", "--vocab-size", str(V),
         "--micro-batch-size", "2", "--global-batch-size", str(GBS), "--train-iters", "1", "--lr", "0", "--min-lr",
         "0", "--lr-warmup-iters", "0", "--log-interval", "1", "--eval-iters", "0", "--data-path", data, "--split",
         "100,0,0", "--calculate-per-token-loss", "--hidden-dropout", "0", "--attention-dropout", "0", "--device",
         "cpu"]
resets = ["--reset-position-ids", "--reset-attention-mask"]


def first_loss(name, extra):
    path = os.path.join(work, name + ".jsonl")
    run("train", *model, *extra, "--metrics-path", path)
    return [json.loads(l)["lm_loss"] for l in open(path) if '"event":"train"' in l][0]


ckpt = os.path.join(work, "ckpt")
packed = first_loss("packed", resets + ["--save", ckpt])
samples = json.loads(run("data", "samples", "--data-path", data, "--seq-length", str(S), "--split", "100,0,0",
                         "--num-samples", str(GBS), "--index", "0", "--count", str(GBS), "--json",
                         "--tokenizer-type", "NullTokenizer", "--vocab-size", str(V)).stdout)["samples"]
loss_sum, count = 0.0, 0
for k, smp in enumerate(samples):
    t = smp["tokens"]  # [S + 1]: inputs t[:S], labels t[1:]
    starts = [0] + [i + 1 for i in range(S - 1) if t[i] == EOD] + [S]
    for a, b in zip(starts, starts[1:]):
        ids = os.path.join(work, "piece.txt")
        with open(ids, "w") as f:
            f.write(" ".join(map(str, t[a:b])) + "\n")
        out = os.path.join(work, "piece.npy")
        run("forward", "--load", ckpt, "--tokens", ids, "--output", out)
        lg = np.load(out)[0].astype(np.float64)  # [b - a, V]
        mx = lg.max(1)
        lse = np.log(np.exp(lg - mx[:, None]).sum(1)) + mx
        for p in range(a, b):
            loss_sum += lse[p - a] - lg[p - a, t[p + 1]]
            count += 1
alone = loss_sum / count
rel = abs(packed - alone) / alone
print(f"first loss with resets {packed:.6f} vs document pieces alone {alone:.6f} ({count} tokens), rel {rel:.2e}")
assert count == GBS * S and rel < 1e-5, "fp32: the same tokens' losses summed in another order"
plain = first_loss("plain", [])
# Without the flags the documents see each other: a freshly initialized model on random tokens predicts nearly
# uniformly, so the difference is small (~6e-5 relative) but far above fp32 rounding (~1e-7, the match above).
assert abs(plain - packed) / packed > 1e-5, (plain, packed)
print(f"without the resets: {plain:.6f}")
q = run("train", *model, *resets, "--context-parallel-size", "2", check=False)
assert q.returncode == 2 and "context_parallel_size" in q.stderr and q.stderr.count("\n") == 1, (q.returncode, q.stderr)
print("packed pretraining OK")
