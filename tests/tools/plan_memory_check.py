#!/usr/bin/env python3
"""`mcpp plan memory`: the CLI of tools/memory_planner.h.

usage: plan_memory_check.py MCPP
  1. GPT-2 124M (GPT-2 BPE vocabulary padded to 50304, B32 x T1024, bf16): the planned parameter count equals
     the textbook GPT-2 count 12 L h^2 + 13 L h + (V + T) h + 2 h, and the model state the bytes per parameter
     of Megatron's mixed precision (2 + 4 + 4 + 8); the table names the largest rank.
  2. TP2 x PP4 x DP2 with virtual stages, SP and the distributed optimizer: 4 stage rows, 2 chunks each; the
     in-flight counts are Megatron's interleaved warmup + 1; the model's total is the textbook count (TP-replicated
     norms and row-parallel biases once), the stages' per-TP-rank counts sum to the hand count of one TP rank's
     shards (with the last stage's tied-embedding copy); the optimizer state is 8 / dp bytes per parameter.
  3. --memory-budget-gib: 1.3B (B8 x T2048) at 40 GiB does not fit and the largest micro-batch size that does
     is the largest k whose own plan (--micro-batch-size k) is <= 40 GiB; k + 1's is above it.
  4. Bad input exits 2 with one "error: ..." line naming the problem (no --world, --world 0, a world the
     layout does not divide, context parallelism, an unknown flag, layers that do not split over the stages).
"""
import json
import subprocess
import sys

MCPP = sys.argv[1]
failures = []


def run(args):
    return subprocess.run([MCPP, "plan", "memory", *args], capture_output=True, text=True, timeout=120)


GPT2 = ["--bf16", "--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12", "--seq-length", "1024",
        "--max-position-embeddings", "1024", "--micro-batch-size", "32"]
r = run(["--world", "1", "--json", *GPT2])
plan = json.loads(r.stdout) if r.returncode == 0 else {}
L, h, V, T = 12, 768, 50304, 1024
textbook = 12 * L * h * h + 13 * L * h + (V + T) * h + 2 * h
if plan.get("total_params") != textbook or plan["stages"][0]["params"] != textbook:
    failures.append(f"GPT-2 124M: planned params {plan.get('total_params')} vs textbook {textbook}: {r.stderr}")
else:
    st = plan["stages"][0]
    for key, per in (("param_bytes", 2), ("grad_bytes", 4), ("main_param_bytes", 4), ("optimizer_state_bytes", 8)):
        if st[key] != per * textbook:
            failures.append(f"GPT-2 124M: {key} {st[key]} != {per} x {textbook}")
    if st["in_flight"] != 1 or st["peak_activation_bytes"] != st["chunks"][0]["context_bytes"]:
        failures.append(f"GPT-2 124M, one microbatch: peak != one context: {st}")
table = run(["--world", "1", *GPT2])
if table.returncode != 0 or "largest: pp rank 0" not in table.stdout or "0.124 B parameters" not in table.stdout:
    failures.append(f"table output: {table.stdout!r} {table.stderr!r}")

# 2. TP2 x PP4 x DP2, V2, SP, distributed optimizer (16 ranks), NullTokenizer vocabulary
pp, vp, dp, M = 4, 2, 2, 8
BIG = ["--world", "16", "--json", "--tensor-model-parallel-size", "2", "--sequence-parallel",
       "--pipeline-model-parallel-size", str(pp), "--num-layers", "16", "--num-layers-per-virtual-pipeline-stage", "2",
       "--hidden-size", "64",
       "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size",
       str(2 * dp * M), "--use-distributed-optimizer", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000"]
r = run(BIG)
plan = json.loads(r.stdout) if r.returncode == 0 else {"stages": []}
if len(plan["stages"]) != pp or any(len(s["chunks"]) != vp for s in plan["stages"]):
    failures.append(f"PP4 V2: expected 4 stages x 2 chunks: {r.stdout[:400]} {r.stderr}")
for s in plan["stages"]:
    want = min((pp - s["pp_rank"] - 1) * 2 + (vp - 1) * pp + 1, M * vp)  # Megatron's interleaved warmup + 1
    if s["in_flight"] != want:
        failures.append(f"PP4 V2 rank {s['pp_rank']}: in flight {s['in_flight']}, Megatron's schedule holds {want}")
    if s["optimizer_state_bytes"] != 8 * s["params"] / dp:
        failures.append(f"PP4 V2 rank {s['pp_rank']}: optimizer bytes {s['optimizer_state_bytes']} != 8 / dp a param")
if plan["stages"]:
    L, h, Vp, T = 16, 64, 1024, 32  # vocabulary 1000 padded to 128 * tp; max positions = seq length
    textbook = 12 * L * h * h + 13 * L * h + (Vp + T) * h + 2 * h
    if plan.get("total_params") != textbook:
        failures.append(f"PP4 V2 TP2: total {plan.get('total_params')} vs the textbook count {textbook}")
    # per TP rank: the vocab-parallel / column / row weights and column biases are halves; norms and the
    # row-parallel biases (proj, fc2) whole
    layer_rank = (3 * h * h + h * h + 8 * h * h) // 2 + (3 * h + 4 * h) // 2 + 2 * h + 4 * h
    shards = sum(s["params"] for s in plan["stages"])
    want = L * layer_rank + (Vp // 2) * h * 2 + T * h + 2 * h  # both embedding copies, positions, final norm
    if shards != want:
        failures.append(f"PP4 V2 TP2: stage shards sum to {shards}, per-rank count {want}")

# 3. the budget
B13 = ["--world", "1", "--json", "--bf16", "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
       "--seq-length", "2048", "--micro-batch-size", "8"]
GiB = 1024.0 ** 3
r = run([*B13, "--memory-budget-gib", "40"])
got = json.loads(r.stdout).get("budget", {}) if r.returncode == 0 else {}
k = got.get("max_micro_batch_size", 0)
if got.get("fits") is not False or k < 1:
    failures.append(f"1.3B at 40 GiB: expected no fit at mbs 8 and some mbs >= 1 that fits: {got} {r.stderr}")
else:
    def total(mbs):
        stages = json.loads(run(B13 + ["--micro-batch-size", str(mbs)]).stdout)["stages"]
        return max(s["total_bytes"] for s in stages)

    if not (total(k) <= 40 * GiB < total(k + 1)):
        failures.append(f"1.3B at 40 GiB: mbs {k} plans {total(k) / GiB} GiB, mbs {k + 1} {total(k + 1) / GiB}")
text = run([a for a in B13 if a != "--json"] + ["--memory-budget-gib", "200"])
if "the plan fits" not in text.stdout or "largest --micro-batch-size that fits" not in text.stdout:
    failures.append(f"budget line: {text.stdout[-400:]!r}")

# 4. errors
for args, needle in ((GPT2, "--world N"), (["--world", "0", *GPT2], "--world wants a positive number, got '0'"),
                     (["--world", "3", "--tensor-model-parallel-size", "2", *GPT2], "world size (3)"),
                     (["--world", "2", "--expert-model-parallel-size", "2", *GPT2], "expert_model_parallel_size 2"),
                     (["--world", "1", "--no-such-flag", *GPT2], "--no-such-flag"),
                     (["--world", "1", "--memory-budget-gib", "0", *GPT2], "--memory-budget-gib wants a positive"),
                     (["--world", "4", "--pipeline-model-parallel-size", "4", "--num-layers", "6"], "num_layers (6)")):
    r = run(args)
    lines = r.stderr.strip().splitlines()
    if r.returncode != 2 or len(lines) != 1 or not lines[0].startswith("error: ") or needle not in lines[0]:
        failures.append(f"{args[:4]}: expected exit 2 and one error line with {needle!r}, got {r.returncode} "
                        f"{r.stdout[-300:]!r} {r.stderr[-300:]!r}")

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print("plan memory checks: PASS")
