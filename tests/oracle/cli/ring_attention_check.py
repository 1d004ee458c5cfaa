#!/usr/bin/env python3
"""Context parallelism in the ring form (`--cp-comm-type p2p`, transformer/ring_attention.h) through `mcpp train`
under mpiexec, against the single-process run on the whole sequences (the parallel-equivalence oracle, end to end).

usage: ring_attention_check.py MCPP WORKDIR
  1. p2p at CP2, CP4, CP2 x TP2 + SP, CP2 x PP2, CP2 x DP2 with the distributed optimizer (overlapped grad reduce
     and param gather), full and selective recompute, a Llama-style model (RoPE on the load-balanced rows, GQA) at
     CP2 and at TP2 x CP2 with 2 query groups (not divisible by tp * cp: only the ring allows it), and CP2 / CP4 with
     attention dropout (each block draws its part of the unsplit mask): every iteration's lm loss and the validation
     loss equal the 1-rank run's within 1e-5 relative;
  2. checkpoints: a p2p CP2 checkpoint continues at 1 rank and at CP2 in the all-to-all form (the token layout is
     not part of the model);
  3. the memory plan of p2p runs equals what the ranks measured;
  4. bad input fails on every rank with one error naming the problem: p2p with the unfused attention,
     --cp-comm-type all_gather, a sequence not divisible into 2 * cp chunks.
"""
import os
import sys

from cli_harness import (LLAMA_GQA, MCPP, TP2_SP, WORK, check_continued, check_error, check_memory_plan, failures,
                         losses, record_corpus, run, same_losses, tiny_train_flags, train)

record_corpus()
M = tiny_train_flags(os.path.join(WORK, "c_text_document"))
LLAMA = LLAMA_GQA
TP2 = TP2_SP
P2P = ["--cp-comm-type", "p2p"]
CP2 = ["--context-parallel-size", "2", *P2P]


def same(name, got_dir, ref_dir):
    same_losses(name, got_dir, ref_dir, 6)


# 1. equivalence with one rank
one = train("one", None, M)
planned = []  # (name, dir, world, flags) for the memory plan check
for name, np_, flags in (
        ("p2p_cp2", 2, [*M, *CP2]),
        ("p2p_cp4", 4, [*M, "--context-parallel-size", "4", *P2P]),
        ("p2p_cp2_tp2_sp", 4, [*M, *CP2, *TP2]),
        ("p2p_cp2_pp2", 4, [*M, *CP2, "--pipeline-model-parallel-size", "2"]),
        ("p2p_cp2_dp2_distopt", 4, [*M, *CP2, "--use-distributed-optimizer", "--overlap-grad-reduce",
                                    "--overlap-param-gather", "--ddp-bucket-size", "3000"]),
        ("p2p_cp2_full_recompute", 2, [*M, *CP2, "--recompute-granularity", "full", "--recompute-method", "uniform",
                                       "--recompute-num-layers", "1"]),
        ("p2p_cp2_selective", 2, [*M, *CP2, "--recompute-granularity", "selective"])):
    d = train(name, np_, flags)
    same(name, d, one)
    planned.append((name, d, np_, flags))
llama1 = train("llama1", None, [*M, *LLAMA])
for name, np_, flags in (("p2p_llama_cp2", 2, [*M, *LLAMA, *CP2]),
                         ("p2p_llama_tp2_cp2", 4, [*M, *LLAMA, *CP2, *TP2])):
    d = train(name, np_, flags)
    same(name, d, llama1)
    planned.append((name, d, np_, flags))

# attention dropout: every block draws its part of the unsplit attention's mask (the same key on every CP rank,
# hidden dropout off), so CP2 and CP4 with dropout equal the 1-rank run with it
DROP = ["--attention-dropout", "0.1"]
drop1 = train("drop1", None, [*M, *DROP])
if losses(drop1) == losses(one):
    failures.append("attention dropout 0.1: the losses without dropout")
same("p2p_cp2_attention_dropout", train("p2p_cp2_drop", 2, [*M, *CP2, *DROP]), drop1)
same("p2p_cp4_attention_dropout", train("p2p_cp4_drop", 4, [*M, "--context-parallel-size", "4", *P2P, *DROP]), drop1)

# 2. checkpoints: the p2p CP2 checkpoint continues at one rank and in the all-to-all form
part = os.path.join(WORK, "p2p_part")
run([MCPP, "train", *M, *CP2, "--exit-interval", "3", "--save", part], np_=2)
for name, np_, flags in (("1 rank", None, M), ("CP2 a2a", 2, [*M, "--context-parallel-size", "2"])):
    check_continued(f"p2p CP2 checkpoint at {name}", part, os.path.join(WORK, "from_p2p_" + name.replace(" ", "_")),
                    np_, flags, losses(one))

# 3. the memory plan against the measurement
for name, d, world, flags in planned:
    PPF = "--pipeline-model-parallel-size"
    plan = check_memory_plan(name, d, world, flags, int(flags[flags.index(PPF) + 1]) if PPF in flags else 1)
    if plan.get("cp") not in (2, 4):
        failures.append(f"memory plan, {name}: the record does not name the CP size: {plan}")

# 4. bad input: one clear error, non-zero exit, no hang
for name, np_, flags, words in (
        ("p2p + unfused", 2, [*M, *CP2, "--attention-impl", "unfused"], ["cp_comm_type p2p", "unfused"]),
        ("all_gather", 2, [*M, "--context-parallel-size", "2", "--cp-comm-type", "all_gather"],
         ["cp_comm_type", "all_gather"]),
        ("2 * cp chunks", 4, [*M, "--context-parallel-size", "4", *P2P, "--seq-length", "12"],
         ["seq_length", "2 * context_parallel_size"])):
    check_error(name, ["train", *flags, "--save", os.path.join(WORK, "bad")], words, np_)

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print(f"ring attention checks: PASS (losses {[round(v, 6) for _, v in sorted(losses(one).items())]})")
