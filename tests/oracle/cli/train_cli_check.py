#!/usr/bin/env python3
"""End-to-end CLI check of `mcpp train / forward / generate` on a tiny GPT-2-vocabulary model.

usage: train_cli_check.py MCPP WORKDIR
  1. `mcpp data preprocess` a small jsonl corpus; `mcpp train` 6 iterations with --save (JSONL metrics);
  2. `mcpp train` resumed to 8 iterations: its losses for 7..8 equal a straight 8-iteration run's;
  3. `mcpp forward` writes logits [n, s, 50257] that equal logits computed in float64 by torch from the
     checkpoint's own safetensors data (independent reader) for the GPT-2 style model;
  4. `mcpp generate` prints the prompt plus text; greedy output is deterministic and the same with the KV cache
     (default) and --no-kv-cache; --batch FILE prints one JSON line per prompt, each as that prompt alone;
  5. bad inputs exit 2 with one 'error:' line: missing checkpoint, bad token file, bf16 on CPU,
     corrupted checkpoint tensor;
  6. sample-based training (--train-samples, --lr-warmup-samples): the iteration count, each iteration's learning
     rate against Megatron's schedule in samples, resume, and --train-iters with it as an error; --rampup-batch-size:
     each iteration's global batch and learning rate (the log line's is Megatron's: after the scheduler step), the iteration count, the first steps equal to a constant run
     of the start batch; per-split data paths: training equal to --data-path with --split 100,0,0, validation only
     with --valid-data-path; the end-of-training validation and test evaluations (equal on the same samples, none
     after --exit-interval, a too small test split a warning); --skip-train evaluates a checkpoint as its run's end.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

MCPP, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
failures = []


def run(*args, expect=0):
    p = subprocess.run([MCPP, *args], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if p.returncode != expect:
        failures.append(f"{' '.join(args[:2])}: exit {p.returncode} (wanted {expect})\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def check_error(args, needle):
    p = run(*args, expect=2)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if len(lines) != 1 or not lines[0].startswith("error:") or needle not in lines[0]:
        failures.append(f"{args[0]}: expected one 'error:' line containing {needle!r}, got {p.stderr!r}")


corpus = os.path.join(WORK, "corpus.jsonl")
with open(corpus, "w") as f:
    for i in range(200):
        f.write(json.dumps({"text": f"Document {i}: the quick brown fox jumps over the lazy dog {i % 7} times."}) + "\n")
run("data", "preprocess", "--input", corpus, "--output-prefix", os.path.join(WORK, "c"), "--append-eod")
data = os.path.join(WORK, "c_text_document")
model = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--lr", "1e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--train-iters", "8",
         "--log-interval", "1", "--eval-interval", "4", "--eval-iters", "1", "--split", "90,10,0",
         "--hidden-dropout", "0.1", "--attention-dropout", "0", "--data-path", data, "--seed", "5"]


def losses(path):
    return {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(path)) if r.get("event") == "train"}


straight = os.path.join(WORK, "straight")
run("train", *model, "--save", straight)
part = os.path.join(WORK, "part")
run("train", *model, "--exit-interval", "6", "--save", part)
run("train", *model, "--load", part, "--save", part)
a, b = losses(os.path.join(straight, "metrics.jsonl")), losses(os.path.join(part, "metrics.jsonl"))
if not a or any(a[i] != b.get(i) for i in (7, 8)):
    failures.append(f"resume: losses differ: straight {a} vs resumed {b}")

# sample-based training (--train-samples 30 at a global batch of 4: 7 iterations, Megatron's train_samples //
# global_batch_size), the schedule in samples (a warmup of 6 samples = 1.5 batches, linear decay over the 30): each
# iteration's logged learning rate is Megatron's at the samples consumed before it; a run stopped at 4 and resumed
# equals the straight one
def records(path, key):
    return {r["iteration"]: r[key] for r in map(json.loads, open(path)) if r.get("event") == "train"}


base = [a for a in model]
for flag in ("--train-iters", "--lr-warmup-iters", "--lr-decay-style"):
    i = base.index(flag)
    del base[i:i + 2]
sample_flags = [*base, "--train-samples", "30", "--lr-warmup-samples", "6", "--lr-decay-style", "linear",
                "--min-lr", "1e-4"]
s_dir = os.path.join(WORK, "samples")
samples_run = run("train", *sample_flags, "--save", s_dir)
lrs = records(os.path.join(s_dir, "metrics.jsonl"), "learning_rate")
want = {}
for k in range(1, 8):
    n = (k - 1) * 4  # samples consumed before iteration k
    want[k] = 1e-3 * n / 6 if n <= 6 else 1e-4 + (1e-3 - 1e-4) * (1 - (n - 6) / (30 - 6))
if sorted(lrs) != list(range(1, 8)) or any(abs(lrs[k] - want[k]) > 1e-9 + 1e-6 * want[k] for k in want):
    failures.append(f"--train-samples: learning rates {lrs} vs Megatron's {want}")
# the log line prints what Megatron's does: the lr after the iteration's scheduler step (metrics "next_learning_rate"),
# Megatron's schedule at the samples consumed after iteration k; the printed value has 7 significant digits (%.6E)
def sched(n):
    return 1e-3 * n / 6 if n <= 6 else 1e-4 + (1e-3 - 1e-4) * (1 - min(n - 6, 24) / (30 - 6))


nxt = records(os.path.join(s_dir, "metrics.jsonl"), "next_learning_rate")
printed = {}
for line in samples_run.stdout.splitlines():
    if " iteration " in line and "learning rate:" in line:
        printed[int(line.split("iteration")[1].split("/")[0])] = float(line.split("learning rate:")[1].split("|")[0])
for k in range(1, 8):
    w = sched(k * 4)
    if k not in nxt or abs(nxt[k] - w) > 1e-9 + 1e-6 * w:
        failures.append(f"--train-samples: next_learning_rate {nxt} vs Megatron's {w} after iteration {k}")
        break
    if k not in printed or abs(printed[k] - w) > 1e-6 * w + 1e-12:
        failures.append(f"--train-samples: the log line's learning rate {printed.get(k)} at iteration {k}, "
                        f"Megatron prints {w}")
        break
s_part = os.path.join(WORK, "samples_part")
run("train", *sample_flags, "--exit-interval", "4", "--save", s_part)
run("train", *sample_flags, "--load", s_part, "--save", s_part)
a, b = losses(os.path.join(s_dir, "metrics.jsonl")), losses(os.path.join(s_part, "metrics.jsonl"))
if sorted(a) != list(range(1, 8)) or any(a[i] != b.get(i) for i in (5, 6, 7)):
    failures.append(f"--train-samples resume: losses differ: straight {a} vs resumed {b}")
check_error(["train", *sample_flags, "--train-iters", "5"], "--train-iters and --train-samples")

# --rampup-batch-size 2 2 8 to a global batch of 6 (micro batch 2): batches 2, 2, 4, 6 while consumed <= 8, then
# 6, 6: Megatron's 6 iterations for 30 samples (the last 4 dropped); the learning rate steps by each batch (linear
# over the 30 samples); the first two steps are the constant-batch-2 run's (the same samples, the same lr)
ramp_base = [a for a in base]
ramp_base[ramp_base.index("--global-batch-size") + 1] = "6"
ramp_flags = [*ramp_base, "--train-samples", "30", "--lr-decay-style", "linear", "--min-lr", "1e-4"]
r_dir = os.path.join(WORK, "rampup")
run("train", *ramp_flags, "--rampup-batch-size", "2", "2", "8", "--save", r_dir)
gbs = records(os.path.join(r_dir, "metrics.jsonl"), "global_batch_size")
if gbs != {1: 2, 2: 2, 3: 4, 4: 6, 5: 6, 6: 6}:
    failures.append(f"--rampup-batch-size: global batch per iteration {gbs}")
lrs = records(os.path.join(r_dir, "metrics.jsonl"), "learning_rate")
consumed = {1: 0, 2: 2, 3: 4, 4: 8, 5: 14, 6: 20}
want = {k: 1e-4 + (1e-3 - 1e-4) * (1 - n / 30) for k, n in consumed.items()}
if sorted(lrs) != list(range(1, 7)) or any(abs(lrs[k] - want[k]) > 1e-9 + 1e-6 * want[k] for k in want):
    failures.append(f"--rampup-batch-size: learning rates {lrs} vs Megatron's {want}")
c_flags = [a for a in ramp_flags]
c_flags[c_flags.index("--global-batch-size") + 1] = "2"
c_dir = os.path.join(WORK, "const2")
run("train", *c_flags, "--save", c_dir)
a, b = losses(os.path.join(r_dir, "metrics.jsonl")), losses(os.path.join(c_dir, "metrics.jsonl"))
if any(a.get(i) is None or a.get(i) != b.get(i) for i in (1, 2)) or a.get(3) == b.get(3):
    failures.append(f"--rampup-batch-size: the first two steps should equal the batch-2 run's: {a} vs {b}")
r_part = os.path.join(WORK, "rampup_part")  # stopped inside the ramp (after the batch-4 step), resumed
run("train", *ramp_flags, "--rampup-batch-size", "2", "2", "8", "--exit-interval", "3", "--save", r_part)
run("train", *ramp_flags, "--rampup-batch-size", "2", "2", "8", "--load", r_part, "--save", r_part)
rp = losses(os.path.join(r_part, "metrics.jsonl"))
if any(a.get(i) != rp.get(i) for i in (4, 5, 6)):
    failures.append(f"--rampup-batch-size resume: losses differ: straight {a} vs resumed {rp}")
check_error(["train", *ramp_flags, "--rampup-batch-size", "3", "3", "8"], "multiples of micro_batch_size")

# per-split data (--train-data-path / --valid-data-path: each split reads all of its own prefix): the training equals
# --data-path with --split 100,0,0 (the same documents, sample order and losses); validation runs on the valid path,
# and without one there is none
ps_base = [a for a in model]
i = ps_base.index("--data-path")
del ps_base[i:i + 2]
i = ps_base.index("--split")
del ps_base[i:i + 2]
whole = os.path.join(WORK, "whole")
run("train", *ps_base, "--data-path", data, "--split", "100,0,0", "--eval-iters", "0", "--save", whole)
per_split = os.path.join(WORK, "per_split")
run("train", *ps_base, "--train-data-path", data, "--valid-data-path", data, "--save", per_split)
train_only = os.path.join(WORK, "train_only")
run("train", *ps_base, "--train-data-path", data, "--save", train_only)
w, ps = losses(os.path.join(whole, "metrics.jsonl")), losses(os.path.join(per_split, "metrics.jsonl"))
if len(w) != 8 or w != ps or w != losses(os.path.join(train_only, "metrics.jsonl")):
    failures.append(f"--train-data-path: losses {ps} differ from --data-path --split 100,0,0: {w}")
valid = [r for r in map(json.loads, open(os.path.join(per_split, "metrics.jsonl"))) if r.get("event") == "valid"]
none = [r for r in map(json.loads, open(os.path.join(train_only, "metrics.jsonl"))) if r.get("event") == "valid"]
in_loop = [r for r in valid if not r.get("end_of_training")]
if len(in_loop) != 2 or len(valid) != 3 or none:
    failures.append(f"--valid-data-path: {len(in_loop)} validations in the loop + {len(valid) - len(in_loop)} at the "
                    f"end (want 2 + 1), without it {len(none)} (want 0)")

# the end-of-training evaluations (Megatron's pretrain after train(): "on validation set", "on test set"): with no
# evaluation inside the loop the end validation and the test evaluation read the same samples of the same path
# (eval_iters global batches from its first sample), so their losses are equal bit for bit; --split's third weight
# gives a test evaluation too; none after --exit-interval; a test split too small for a sample is a warning, not an
# error (the default --split 969,30,1 of a small corpus)
def evals(d):
    return [r for r in map(json.loads, open(os.path.join(d, "metrics.jsonl"))) if r.get("event") in ("valid", "test")]


te = os.path.join(WORK, "test_eval")
p = run("train", *ps_base, "--train-data-path", data, "--valid-data-path", data, "--test-data-path", data,
        "--eval-interval", "100", "--save", te)
ev = evals(te)
if ([(r["event"], r["iteration"], r.get("end_of_training")) for r in ev] != [("valid", 8, True), ("test", 8, True)]
        or ev[0]["lm_loss"] != ev[1]["lm_loss"] or "validation loss at iteration 8 on test set" not in p.stdout):
    failures.append(f"end-of-training evaluations: {ev} (want one validation and one equal test loss at 8)")
sp = os.path.join(WORK, "split_test")
run("train", *ps_base, "--data-path", data, "--split", "80,10,10", "--save", sp)
if [r["event"] for r in evals(sp) if r.get("end_of_training")] != ["valid", "test"]:
    failures.append(f"--split 80,10,10: end-of-training evaluations {evals(sp)}")
ex = os.path.join(WORK, "exit_eval")
run("train", *ps_base, "--data-path", data, "--split", "80,10,10", "--exit-interval", "4", "--save", ex)
if any(r.get("end_of_training") for r in evals(ex)):
    failures.append(f"--exit-interval: no end-of-training evaluation expected, got {evals(ex)}")
# --skip-train (Megatron's): the loaded checkpoint evaluated, nothing trained or saved — the straight run's final
# checkpoint (saved before its end evaluation) evaluates the same validation samples to the same loss, bit for bit
sk = os.path.join(WORK, "skip_train.jsonl")
p = run("train", *model, "--load", straight, "--skip-train", "--metrics-path", sk)
got = [r for r in map(json.loads, open(sk)) if r.get("event") in ("train", "valid", "test")] if os.path.exists(sk) else []
want = [r for r in evals(straight) if r.get("end_of_training")]
if "skipping training" not in p.stdout or [r["event"] for r in got] != ["valid"] or \
        got[0]["lm_loss"] != want[0]["lm_loss"] or got[0]["iteration"] != 8:
    failures.append(f"--skip-train: {got} (want one end-of-training validation equal to {want})")
tiny = os.path.join(WORK, "tiny_test_split")
p = run("train", *ps_base, "--data-path", data, "--split", "969,30,1", "--save", tiny)
if "no test evaluation at the end of training" not in p.stdout + p.stderr or \
        [r["event"] for r in evals(tiny) if r.get("end_of_training")] != ["valid"]:
    failures.append(f"--split 969,30,1 on {data}: expected a warning and no test evaluation, got {evals(tiny)}")
check_error(["train", *ps_base, "--data-path", data, "--valid-data-path", data], "data_path and train_data_path")

# forward vs an independent float64 torch computation from the checkpoint's safetensors bytes.
tokens = os.path.join(WORK, "tokens.txt")
with open(tokens, "w") as f:
    f.write("464 2068 7586 21831 18045 625 262 16931 3290 13\n")
    f.write("13313 352 25 262 2068 7586 21831 18045 625 262\n")
out = os.path.join(WORK, "logits.npy")
run("forward", "--load", straight, "--tokens", tokens, "--output", out)
ckdir = os.path.join(straight, "iter_0000008")
manifest = json.load(open(os.path.join(ckdir, "manifest.json")))


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b0, b1 = v["data_offsets"]
        assert v["dtype"] == "F32"
        out[k] = np.frombuffer(raw[8 + n + b0:8 + n + b1], dtype="<f4").reshape(v["shape"]).astype(np.float64)
    return out


W = read_safetensors(os.path.join(ckdir, "model.safetensors"))
try:
    import torch
    import torch.nn.functional as F
    torch.set_default_dtype(torch.float64)
    P = {k: torch.tensor(v) for k, v in W.items()}
    ids = torch.tensor(np.loadtxt(tokens, dtype=np.int64))  # [n, s]
    n, s = ids.shape
    h, L, nh = 32, 2, 4
    hd = h // nh
    x = P["embedding.word_embeddings.weight"][ids] + P["embedding.position_embeddings.weight"][:s]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
    for i in range(L):
        p = f"decoder.layers.{i}."
        a_ = F.layer_norm(x, (h,), P[p + "input_layernorm.weight"], P[p + "input_layernorm.bias"], 1e-5)
        qkv = (a_ @ P[p + "self_attention.linear_qkv.weight"].T + P[p + "self_attention.linear_qkv.bias"]).view(n, s, nh, 3, hd)
        q, k, v = (qkv[:, :, :, j].transpose(1, 2) for j in range(3))
        att = (q @ k.transpose(-1, -2) / hd ** 0.5).masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + att.transpose(1, 2).reshape(n, s, h) @ P[p + "self_attention.linear_proj.weight"].T + P[p + "self_attention.linear_proj.bias"]
        m = F.layer_norm(x, (h,), P[p + "pre_mlp_layernorm.weight"], P[p + "pre_mlp_layernorm.bias"], 1e-5)
        f1 = F.gelu(m @ P[p + "mlp.linear_fc1.weight"].T + P[p + "mlp.linear_fc1.bias"], approximate="tanh")
        x = x + f1 @ P[p + "mlp.linear_fc2.weight"].T + P[p + "mlp.linear_fc2.bias"]
    x = F.layer_norm(x, (h,), P["decoder.final_layernorm.weight"], P["decoder.final_layernorm.bias"], 1e-5)
    ref = (x @ P["embedding.word_embeddings.weight"].T)[..., :50257].numpy()
    ours = np.load(out)
    err = np.max(np.abs(ours - ref)) / np.max(np.abs(ref))
    print(f"forward vs torch float64: shape {ours.shape}, max rel err {err:.2e}")
    if ours.shape != (2, 10, 50257) or not err < 1e-5:  # fp32 vs float64
        failures.append(f"forward: shape {ours.shape}, rel err {err}")
except ImportError:
    failures.append("torch not importable by this python (use /usr/bin/python3)")

# HF round trip: export -> import -> forward gives the same logits; --finetune from the import trains.
hf = os.path.join(WORK, "hf")
run("ckpt", "export", "--load", straight, "--format", "hf-gpt2", "--output", hf)
imported = os.path.join(WORK, "imported")
run("ckpt", "import", "--input", hf, "--format", "hf-gpt2", "--save", imported)
out2 = os.path.join(WORK, "logits_imported.npy")
run("forward", "--load", imported, "--tokens", tokens, "--output", out2)
if os.path.exists(out2) and not np.array_equal(np.load(out), np.load(out2)):
    failures.append("HF export/import round trip changed the logits")
ft = os.path.join(WORK, "finetune")
p = run("train", *model, "--load", imported, "--finetune", "--save", ft, "--train-iters", "2", "--eval-interval", "2")
if "loaded checkpoint" not in p.stdout + p.stderr:
    failures.append(f"finetune from the imported checkpoint did not load it: {p.stdout[-500:]} {p.stderr[-500:]}")

g1 = run("generate", "--load", straight, "--prompt", "The quick brown", "--max-new-tokens", "5")
g2 = run("generate", "--load", straight, "--prompt", "The quick brown", "--max-new-tokens", "5")
if not g1.stdout.startswith("The quick brown") or g1.stdout != g2.stdout:
    failures.append(f"generate: {g1.stdout!r} vs {g2.stdout!r}")

g3 = run("generate", "--load", straight, "--prompt", "The quick brown", "--max-new-tokens", "5", "--no-kv-cache")
if g3.stdout != g1.stdout:
    failures.append(f"generate with the KV cache {g1.stdout!r} vs without {g3.stdout!r}")
prompts = os.path.join(WORK, "prompts.txt")
with open(prompts, "w") as f:
    f.write("The quick brown\n\nOnce upon a time\n")
gb = run("generate", "--load", straight, "--batch", prompts, "--max-new-tokens", "5")
g4 = run("generate", "--load", straight, "--prompt", "Once upon a time", "--max-new-tokens", "5")
rows = [json.loads(line) for line in gb.stdout.splitlines()]
want = [g1.stdout.rstrip("\n"), g4.stdout.rstrip("\n")]
if [r["prompt"] + r["completion"] for r in rows] != want:
    failures.append(f"generate --batch: {rows!r} vs the single prompts {want!r}")

check_error(["generate", "--load", os.path.join(WORK, "nope"), "--prompt", "x"], "nope")
check_error(["generate", "--load", straight, "--prompt", "x", "--bf16"], "bf16")
with open(os.path.join(WORK, "bad_tokens.txt"), "w") as f:
    f.write("1 2 banana\n")
check_error(["forward", "--load", straight, "--tokens", os.path.join(WORK, "bad_tokens.txt"), "--output", out], "banana")
check_error(["train", *model, "--bf16"], "bf16")
check_error(["train", *model, "--device", "tpu"], "device")
if not os.path.exists("/dev/nvidia0"):  # a GPU-less box: --device cuda must be refused, naming the field
    check_error(["train", *model, "--device", "cuda"], "device: cuda requested")
check_error(["train", *model, "--fp16", "--device", "cpu"], "fp16")
# Flip one byte of a tensor in a copy of the checkpoint: loading names the tensor.
broken = os.path.join(WORK, "broken")
shutil.copytree(straight, broken)
st = os.path.join(broken, "iter_0000008", "model.safetensors")
raw = bytearray(open(st, "rb").read())
raw[-3] ^= 0x40
open(st, "wb").write(bytes(raw))
check_error(["forward", "--load", broken, "--tokens", tokens, "--output", out], "checksum")

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("train/forward/generate CLI checks: PASS")
