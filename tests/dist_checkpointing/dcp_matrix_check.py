#!/usr/bin/env python3
"""Reshard matrix of the sharded checkpoint through `mcpp train` under mpiexec (issue 5).

usage: dcp_matrix_check.py MCPP WORKDIR
  Save at TP2 x DP2 with the distributed optimizer (iteration 3 of 6). For each target layout
  (TP1 x DP1 on 1 rank, TP4, TP2 x DP2 without distopt, DP4, DP2 with distopt, and the source layout):
  1. load and re-save at once under the target layout (--train-iters 3): every logical tensor, model and
     optimizer (exp_avg, exp_avg_sq), assembled by the independent oracle dcp_oracle.py from the new
     checkpoint, is bit-identical to the one assembled from the TP2 x DP2 checkpoint;
  2. load and train to 6: losses of iterations 4..6 equal the uninterrupted TP2 x DP2 run (1e-6 rel);
  plus: every rank wrote its own files, each element is stored exactly once, `mcpp ckpt verify` and
  `info` pass, and `mcpp ckpt export --format hf-gpt2` gives byte-identical files from either layout.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle", "cli"))
from cli_harness import MCPP, WORK, failures, losses, record_corpus, run  # noqa: E402  argv, fresh work dir, run()
from dcp_oracle import assemble  # noqa: E402


record_corpus()
# swiglu: fc1 has two TP segments per rank (gate and up halves), the hard case for global offsets.
M = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
     "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
     "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--lr-decay-iters", "6", "--log-interval", "1", "--eval-interval", "100",
     "--eval-iters", "1", "--split", "90,10,0", "--hidden-dropout", "0", "--attention-dropout", "0", "--swiglu",
     "--data-path", os.path.join(WORK, "c_text_document"), "--seed", "5"]


def vocab(tp):
    return ["--make-vocab-size-divisible-by", str(128 // tp)]  # same padded vocab at every TP


# Small buckets: the DP shard boundaries cut parameters (fc1 included) into flat pieces, which are saved as
# rectangles of the logical tensor (partial rows, split at the gate/up segment boundary).
SRC = ["--tensor-model-parallel-size", "2", *vocab(2), "--use-distributed-optimizer", "--ddp-bucket-size", "3000"]


full = os.path.join(WORK, "full")
run([MCPP, "train", *M, *SRC, "--train-iters", "6", "--save", full], 4)
src = os.path.join(WORK, "src")
run([MCPP, "train", *M, *SRC, "--train-iters", "6", "--exit-interval", "3", "--save", src], 4)
src_it = os.path.join(src, "iter_0000003")
ref, ref_man = assemble(src_it)
files = sorted(os.listdir(src_it))
want = [f"{k}.rank_{r:05d}.safetensors" for k in ("model", "optimizer") for r in range(4)] + ["manifest.json"]
if files != sorted(want):
    failures.append(f"source checkpoint files: {files}")
n_keys = len([k for k in ref if not k.startswith("optimizer.")])
if len(ref) != 3 * n_keys or n_keys < 10:
    failures.append(f"source checkpoint keys: {len(ref)} with {n_keys} model keys")
fc1 = [e for e in ref_man["tensors"] if e["key"].startswith("optimizer.exp_avg.") and "linear_fc1.weight" in e["key"]]
if not any(e["local_shape"][0] == 1 and e["local_shape"][1] < e["global_shape"][1] for e in fc1):
    failures.append("no distributed-optimizer piece of fc1 was cut inside a row: the test lost its hard case")
if run([MCPP, "ckpt", "verify", "--load", src]).returncode != 0 or run([MCPP, "ckpt", "info", "--load", src]).returncode:
    failures.append("ckpt verify/info failed on the sharded checkpoint")

TARGETS = {
    "tp1": (1, ["--tensor-model-parallel-size", "1", *vocab(1)]),
    "tp4": (4, ["--tensor-model-parallel-size", "4", *vocab(4)]),
    "tp2dp2": (4, ["--tensor-model-parallel-size", "2", *vocab(2)]),
    "dp4": (4, ["--tensor-model-parallel-size", "1", *vocab(1)]),
    "dp2_distopt": (2, ["--tensor-model-parallel-size", "1", *vocab(1), "--use-distributed-optimizer",
                        "--ddp-bucket-size", "5000"]),
    "tp2dp2_distopt": (4, SRC),
}
ref_loss = losses(full)
if len(ref_loss) != 6:
    failures.append(f"uninterrupted run losses: {ref_loss}")
for name, (np_, flags) in TARGETS.items():
    resaved = os.path.join(WORK, "resave_" + name)
    run([MCPP, "train", *M, *flags, "--train-iters", "3", "--load", src, "--save", resaved], np_)
    try:
        got, man = assemble(os.path.join(resaved, "iter_0000003"))
        bad = [k for k in ref if k not in got or got[k].shape != ref[k].shape or got[k].tobytes() != ref[k].tobytes()]
        if bad or set(got) != set(ref):
            failures.append(f"{name}: logical tensors differ after load + re-save: {bad[:5]} of {len(ref)}")
        if man["meta"]["optimizer"]["step"] != ref_man["meta"]["optimizer"]["step"]:
            failures.append(f"{name}: optimizer step {man['meta']['optimizer']} vs {ref_man['meta']['optimizer']}")
    except (AssertionError, OSError, KeyError) as e:
        failures.append(f"{name}: re-saved checkpoint unreadable by the oracle: {e!r}")
    cont = os.path.join(WORK, "cont_" + name)
    shutil.copytree(src, cont, ignore=shutil.ignore_patterns("metrics.jsonl"))
    run([MCPP, "train", *M, *flags, "--train-iters", "6", "--load", cont, "--save", cont], np_)
    got_loss = losses(cont)
    for i in (4, 5, 6):  # fp32, different reduction orders across layouts: 1e-6 relative
        if i not in got_loss or abs(got_loss[i] - ref_loss.get(i, 0)) > 1e-6 * abs(ref_loss.get(i, 1)):
            failures.append(f"{name}: loss at {i}: {got_loss.get(i)} vs uninterrupted {ref_loss.get(i)}")
    print(f"{name}: np {np_}, losses {[got_loss.get(i) for i in (4, 5, 6)]}")

# Export from two layouts of the same state: identical HF files (the planner assembles logical tensors).
M_GPT2 = [a for a in M if a != "--swiglu"]
g_src = os.path.join(WORK, "g_src")
run([MCPP, "train", *M_GPT2, *SRC, "--train-iters", "2", "--save", g_src], 4)
g_tp1 = os.path.join(WORK, "g_tp1")
run([MCPP, "train", *M_GPT2, *TARGETS["tp1"][1], "--train-iters", "2", "--load", g_src, "--save", g_tp1,
     "--no-load-optim"], 1)
for d in (g_src, g_tp1):
    run([MCPP, "ckpt", "export", "--load", d, "--format", "hf-gpt2", "--output", d + "_hf"])
try:
    a = open(os.path.join(g_src + "_hf", "model.safetensors"), "rb").read()
    b = open(os.path.join(g_tp1 + "_hf", "model.safetensors"), "rb").read()
    if a != b or len(a) < 1000:
        failures.append("hf-gpt2 export from TP2 x DP2 differs from the export of its TP1 re-save")
except OSError as e:
    failures.append(f"export missing: {e}")

if failures:
    print("FAIL\n" + "\n".join(failures))
    sys.exit(1)
print(f"OK: TP2xDP2+distopt checkpoint ({len(ref)} logical tensors) reloads bit-identically at "
      f"{', '.join(TARGETS)}; losses match the uninterrupted run; export identical")
