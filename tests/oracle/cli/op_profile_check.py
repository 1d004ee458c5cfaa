#!/usr/bin/env python3
"""MCPP_PROFILE_OPS=1 mcpp train: the op table on stderr names the ops of a step with plausible counts.

Two layers, 3 iterations, 1 microbatch; the trainer resets the table after the first (warm-up)
iteration, so 2 steps are counted: linear_fwd runs 3 times per layer (qkv, proj, fc2) + the LM head
= 7 per step -> 14 calls; the GELU MLP's fc1 is one linear_gelu_fwd per layer -> 4, and fc2's dgrad one
linear_dgelu_bwd per layer -> 4; norm forwards 2 per layer + final = 5 per step -> 10, of which the
pre_mlp_layernorm's (1 per layer -> 4) and layer 1's input_layernorm run fused with the residual add
(add_layernorm_fwd), and the layers' norm backwards (2 per layer -> 8) fused with the residual gradient
(add_layernorm_bwd). Hidden dropout is Megatron's default 0.1 here: the layers' branch dropouts ride in those
fused norms (bias-dropout-add), so the only dropout passes left are the embedding's and the last layer's
mlp branch (summed apart before the final norm). One multi-tensor adamw_multi_step per step over every
parameter (no per-parameter adamw_step). Without the variable no table is printed.
usage: op_profile_check.py MCPP_BIN WORKDIR
"""
import os
import re
import subprocess
import sys

mcpp, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
data = os.path.join(work, "rnd")
here = os.path.dirname(os.path.abspath(__file__))
subprocess.run([sys.executable, os.path.join(here, "..", "..", "..", "bench", "gpu", "random_tokens.py"), data,
                "--tokens", "20000", "--vocab", "256", "--doc-len", "1000"], check=True, capture_output=True)
args = [mcpp, "train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "256", "--train-iters", "3", "--log-interval", "1",
        "--eval-iters", "0", "--attention-dropout", "0", "--data-path", data, "--split", "100,0,0", "--device", "cpu"]
env = dict(os.environ, MCPP_PROFILE_OPS="1", OMP_NUM_THREADS="1")
p = subprocess.run(args, env=env, capture_output=True, text=True)
assert p.returncode == 0, p.stderr
rows = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+) \(cpu\)\s+(\d+)\s", p.stderr, re.M)}
assert "op profile (MCPP_PROFILE_OPS)" in p.stderr, p.stderr
assert rows.get("linear_fwd") == 14, rows
assert rows.get("linear_gelu_fwd") == 4 and rows.get("linear_dgelu_bwd") == 4, rows
assert "gelu_fwd" not in rows and "gelu_bwd" not in rows, rows  # GELU rides in the fused ops
# per step (2 layers): the first layer's input norm and the final norm plain; the other residual adds fused
# with the norm after them (pre_mlp x 2, layer 1's input norm) with their dropouts; add_inplace and dropout
# left for the embedding's and the last layer's mlp branch (summed apart: the final norm's backward has no dres)
assert rows.get("layernorm_fwd") == 4 and rows.get("add_layernorm_fwd") == 6, rows
assert rows.get("add_inplace") == 4, rows
assert rows.get("dropout_fwd") == 4 and rows.get("dropout_bwd") == 4, rows
assert rows.get("layernorm_bwd") == 2 and rows.get("add_layernorm_bwd") == 8, rows
assert rows.get("adamw_multi_step") == 2 and "adamw_step" not in rows, rows
q = subprocess.run(args, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
assert q.returncode == 0 and "op profile" not in q.stderr, q.stderr
print("op profile OK:", {k: rows[k] for k in sorted(rows)[:6]})
