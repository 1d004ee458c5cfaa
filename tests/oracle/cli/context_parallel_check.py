#!/usr/bin/env python3
"""Context parallelism (`--context-parallel-size`, all-to-all attention) through `mcpp train` under mpiexec,
against the single-process run on the whole sequences (the parallel-equivalence oracle, end to end).

usage: context_parallel_check.py MCPP WORKDIR
  1. CP2, CP4, CP2 x TP2 + SP (also with --tp-comm-overlap), CP2 x PP2, CP2 x DP2 with the distributed
     optimizer (overlapped grad reduce and param gather), a Llama-style model (RoPE, GQA) at CP2, full (the
     all-to-alls re-run inside the backward) and selective recompute and the unfused attention at CP2: every
     iteration's lm loss and the validation loss equal the 1-rank run's within 1e-5 relative;
     --qk-layernorm at TP2 x DP2 (no SP), CP2 x TP2 + SP and (LayerNorm) TP2 + SP x PP2 equals its 1-rank run, and
     its TP2 checkpoint continues at CP2; selective recompute "layernorm" at CP2 x TP2 + SP with --tp-comm-overlap
     (with core_attn and mlp) and at TP2 x DP2 without SP (Llama-style) equals the 1-rank runs;
  2. --calculate-per-token-loss at CP2 x DP2 equals its 1-rank run;
  3. a CP2 run interrupted at 3 and resumed at CP2 is bit-exact; its checkpoint continues at 1 rank, and a
     1-rank checkpoint at CP2 x DP2 (1e-5);
  4. the memory plan of CP runs equals what the ranks measured (activations byte for byte, model state up to
     the distributed optimizer's padding), and `mcpp plan memory --json` prints the trainer's record;
  5. bad input fails on every rank with one error naming the problem: --cp-comm-type all_gather, query groups not
     divisible by tp * cp, --expert-model-parallel-size 2 (no MoE layers).
"""
import os
import shutil
import sys

from cli_harness import (LLAMA_GQA, MCPP, STDOUT, TP2_SP, WORK, check_continued, check_error, check_memory_plan,
                         close, failures, losses, record_corpus, run, same_losses, tiny_train_flags, train)

record_corpus()
M = tiny_train_flags(os.path.join(WORK, "c_text_document"))
LLAMA = LLAMA_GQA
CP2 = ["--context-parallel-size", "2"]
TP2 = TP2_SP


def same(name, got_dir, ref_dir, tol=1e-5):
    same_losses(name, got_dir, ref_dir, 6, tol)


# 1. equivalence with one rank
one = train("one", None, M)
planned = []  # (name, dir, world, flags) for the memory plan check
for name, np_, flags in (
        ("cp2", 2, [*M, *CP2]),
        ("cp4", 4, [*M, "--context-parallel-size", "4"]),
        ("cp2_tp2_sp", 4, [*M, *CP2, *TP2]),
        ("cp2_pp2", 4, [*M, *CP2, "--pipeline-model-parallel-size", "2"]),
        ("cp2_dp2_distopt", 4, [*M, *CP2, "--use-distributed-optimizer", "--overlap-grad-reduce",
                                "--overlap-param-gather", "--ddp-bucket-size", "3000"]),
        ("cp2_tp2_sp_overlap", 4, [*M, *CP2, *TP2, "--tp-comm-overlap"]),
        ("cp2_full_recompute", 2, [*M, *CP2, "--recompute-granularity", "full", "--recompute-method", "uniform",
                                   "--recompute-num-layers", "1"]),
        ("cp2_unfused", 2, [*M, *CP2, "--attention-impl", "unfused"]),
        ("cp2_selective", 2, [*M, *CP2, "--recompute-granularity", "selective"]),
        # the norms' outputs re-run in backward and re-gathered over SP (a plain all-gather where the forward ran the
        # --tp-comm-overlap ring); with mlp the MLP re-runs from the recomputed norm
        ("cp2_tp2_sp_overlap_layernorm", 4, [*M, *CP2, *TP2, "--tp-comm-overlap", "--recompute-granularity",
                                             "selective", "--recompute-modules", "core_attn", "layernorm", "mlp"])):
    d = train(name, np_, flags)
    same(name, d, one)
    planned.append((name, d, np_, flags))
llama1 = train("llama1", None, [*M, *LLAMA])
llama2 = train("llama_cp2", 2, [*M, *LLAMA, *CP2])
same("Llama CP2", llama2, llama1)
planned.append(("Llama CP2", llama2, 2, [*M, *LLAMA, *CP2]))
TP2_NO_SP = ["--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"]
LN = [*M, *LLAMA, *TP2_NO_SP, "--recompute-granularity", "selective", "--recompute-modules", "layernorm"]
llama_ln = train("llama_tp2_dp2_layernorm", 4, LN)
same("Llama TP2 x DP2 (no SP) --recompute-modules layernorm", llama_ln, llama1)
planned.append(("Llama TP2 x DP2 layernorm", llama_ln, 4, LN))

# 1b. --qk-layernorm (per-head norms of q and k before RoPE; their replicated weights' partial grads summed over TP
#     with or without SP, over CP by the DP x CP reduction): TP2 x DP2 without SP, CP2 x TP2 + SP, and the GPT-2
#     style (LayerNorm qk norms with biases) at TP2 + SP x PP2 equal their 1-rank runs; a TP2 x DP2 checkpoint
#     continues at CP2.
#     lr 1e-2: large enough that a qk-norm weight updated from a TP rank's partial grad changes the losses.
MQ = list(M)
MQ[MQ.index("--lr") + 1] = "1e-2"
QK_LLAMA = [*MQ, "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
            "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--qk-layernorm"]
qk1 = train("qk1", None, QK_LLAMA)
same("qk-layernorm TP2 x DP2 (no SP)", train("qk_tp2_dp2", 4, [*QK_LLAMA, *TP2_NO_SP]), qk1)
qk_cp = train("qk_cp2_tp2_sp", 4, [*QK_LLAMA, *CP2, *TP2])
same("qk-layernorm CP2 x TP2 + SP", qk_cp, qk1)
planned.append(("qk-layernorm CP2 x TP2 + SP", qk_cp, 4, [*QK_LLAMA, *CP2, *TP2]))
qk_gpt = train("qk_gpt1", None, [*MQ, "--qk-layernorm"])
same("qk-layernorm (LayerNorm) TP2 + SP x PP2",
     train("qk_gpt_tp2_pp2", 4, [*MQ, "--qk-layernorm", *TP2, "--pipeline-model-parallel-size", "2"]), qk_gpt)
qk_part = train("qk_tp2_part", 4, [*QK_LLAMA, *TP2_NO_SP, "--exit-interval", "3"])
check_continued("qk-layernorm TP2 x DP2 checkpoint at CP2", qk_part, qk_part + "_cp2", 2, [*QK_LLAMA, *CP2],
                losses(qk1))

# 2. the per-token loss (gradients divided by the global token count after the DP x CP reduction)
tok1 = train("tok1", None, [*M, "--calculate-per-token-loss"])
tok4 = train("tok_cp2_dp2", 4, [*M, *CP2, "--calculate-per-token-loss"])
same("CP2 x DP2 --calculate-per-token-loss", tok4, tok1)

# 3. checkpoints: resume at CP2 bit-exact; the CP2 checkpoint continues at one rank
straight = os.path.join(WORK, "cp2")
part = os.path.join(WORK, "cp2_part")
run([MCPP, "train", *M, *CP2, "--exit-interval", "3", "--save", part], np_=2)
shutil.copytree(part, part + "_at1")
run([MCPP, "train", *M, *CP2, "--load", part, "--save", part], np_=2)
a, b = losses(straight), losses(part)
if len(a) != 6 or any(b.get(i) != a[i] for i in a):
    failures.append(f"CP2 resume is not bit-exact: {b} vs {a}")
os.remove(os.path.join(part + "_at1", "metrics.jsonl"))
run([MCPP, "train", *M, "--load", part + "_at1", "--save", part + "_at1"])
c, o = losses(part + "_at1"), losses(one)
if sorted(c) != [4, 5, 6] or any(not close(c.get(i), o[i]) for i in (4, 5, 6)):
    failures.append(f"CP2 checkpoint continued at 1 rank: {c} vs {o}")

one_part = os.path.join(WORK, "one_part")  # and a 1-rank checkpoint continues at CP2 x DP2
run([MCPP, "train", *M, "--exit-interval", "3", "--save", one_part])
os.remove(os.path.join(one_part, "metrics.jsonl"))
run([MCPP, "train", *M, *CP2, "--load", one_part, "--save", one_part], np_=4)
c = losses(one_part)
if sorted(c) != [4, 5, 6] or any(not close(c.get(i), o[i]) for i in (4, 5, 6)):
    failures.append(f"1-rank checkpoint continued at CP2 x DP2: {c} vs {o}")

# 4. the memory plan against the measurement, and the CLI's plan against the trainer's record
for name, d, world, flags in planned:
    PPF = "--pipeline-model-parallel-size"
    plan = check_memory_plan(name, d, world, flags, int(flags[flags.index(PPF) + 1]) if PPF in flags else 1)
    CPF = "--context-parallel-size"
    if plan.get("cp") != (int(flags[flags.index(CPF) + 1]) if CPF in flags else 1):
        failures.append(f"memory plan, {name}: the record does not name the CP size: {plan}")

# the per-parameter line and the plan's header name the CP size (the optimizer shards over dp x cp)
if "memory per parameter per rank (dp=2 x cp=2, distributed optimizer" not in STDOUT.get("cp2_dp2_distopt", ""):
    failures.append(f"CP2 x DP2: the trainer's memory-per-parameter line: {STDOUT.get('cp2_dp2_distopt', '')[:600]!r}")
text = run([MCPP, "plan", "memory", "--world", "4", *M, *CP2]).stdout
if "tp 1 x pp 1 x dp 2 x cp 2" not in text:
    failures.append(f"`mcpp plan memory` at CP2 x DP2 does not name the layout: {text[:300]!r}")

# 5. bad input: one clear error, non-zero exit, no hang
for name, np_, flags, words in (
        ("cp_comm_type all_gather", 2, [*M, *CP2, "--cp-comm-type", "all_gather"], ["cp_comm_type", "a2a"]),
        ("groups % (tp * cp)", 4, [*M, *LLAMA, *CP2, *TP2],
         ["num_query_groups", "context_parallel_size"]),
        ("expert parallel", 2, [*M, "--expert-model-parallel-size", "2"], ["expert_model_parallel_size"])):
    check_error(name, ["train", *flags, "--save", os.path.join(WORK, "bad")], words, np_)

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print(f"context parallel checks: PASS (losses {[round(v, 6) for _, v in sorted(losses(one).items())]})")
