#!/usr/bin/env python3
"""Multi-token prediction (`mcpp train --mtp-num-layers`) under mpiexec against the single-process run.

usage: mtp_check.py MCPP WORKDIR
  1. a Llama-style model (untied, RoPE, GQA) with 2 MTP depths at 1 rank logs "mtp_1 loss" / "mtp_2 loss" beside the
     lm loss (metrics: mtp_losses), and its lm losses differ from the same run without MTP from iteration 3 on
     (the depths' gradients reach the decoder) while iterations 1-2 are equal (the depths do not touch the forward;
     the first step's learning rate is 0);
  2. TP2 + SP x DP2, PP2 x DP2 (the last stage holds the word embeddings' copy for the depths) and
     --pipeline-model-parallel-layout "Et|tmmL" equal 1 rank: every lm loss, validation loss and MTP loss (1e-5);
     so do (4 layers) interleaved PP2 x DP2 with the distributed optimizer and TP2 + SP with --tp-comm-overlap;
     so do CP2, CP2 / CP4 in the p2p form (load-balanced chunks: the rolled rows cross ranks both ways) and
     CP2 (p2p) x TP2 + SP (2 query groups: the a2a form needs tp * cp of them), and CP2 x DP2 with --calculate-per-token-loss its 1-rank run;
  3. a tied GPT-2-style model with RoPE at PP2 equals 1 rank (the tied copy serves the output layer and the depths);
  4. full recompute (uniform: the depths re-run in backward) equals the plain run bit for bit; a MoE model whose last
     layer is MoE (so are the depths) at EP2 x DP2 equals 1 rank;
  5. a PP2 checkpoint resumes at PP2 bit-exact and continues at 1 rank (1e-5); `mcpp ckpt convert` to PP2 keeps the
     depths (the converted run continues as the PP2 one); resuming without the depths is a named error and
     --use-checkpoint-args takes them from the checkpoint;
  6. the memory plan of the TP2 + SP x DP2 and PP2 runs equals what their stages measured;
  7. bad input is one named error: MTP with learned absolute positions, a layout whose 'm' count differs or whose 'm'
     sit away from 'L' or before a 't', a negative depth count; HF export of an MTP checkpoint refuses.
"""
import os
import shutil
import sys

from cli_harness import (LLAMA_GQA, MCPP, MOE, STDOUT, TP2_SP, WORK, check_continued, check_error,
                         check_memory_plan, close, failures, losses, record_corpus, records, run, same_losses,
                         tiny_train_flags, train)

data = record_corpus()
M = tiny_train_flags(data)
MTP = ["--mtp-num-layers", "2", "--mtp-loss-scaling-factor", "0.3"]
L = M + LLAMA_GQA + MTP


def mtp_losses(d):
    return {r["iteration"]: r.get("mtp_losses") for r in records(d, "train")}


def same_mtp(name, got, ref, tol=1e-5):
    a, b = mtp_losses(ref), mtp_losses(got)
    if not a or any(not v or len(v) != 2 for v in a.values()):
        failures.append(f"{name}: the reference logs no 2-depth mtp_losses: {a}")
        return
    for i, v in a.items():
        w = b.get(i)
        if not w or len(w) != 2 or any(not close(x, y, tol) for x, y in zip(w, v)):
            failures.append(f"{name}: mtp losses differ at iteration {i}: {w} vs {v}")


# 1. one rank
one = train("one", None, L)
out = STDOUT["one"]
if "mtp_1 loss:" not in out or "mtp_2 loss:" not in out:
    failures.append(f"the log line names no mtp_1 / mtp_2 loss: {out[-800:]!r}")
plain = train("plain", None, M + LLAMA_GQA)
a, p = losses(one), losses(plain)
# (the first step's learning rate is 0: warmup from 0 over 1 iteration, so iteration 2 is equal too)
if not (close(a.get(2), p.get(2), 1e-6) and all(a.get(i) != p.get(i) for i in range(3, 7))):
    failures.append(f"MTP should leave iterations 1-2 equal and change 3..6: {a} vs {p}")
m = mtp_losses(one)
if any(not v or not all(3.0 < x < 12.0 for x in v) for v in m.values()) or m[6][0] >= m[1][0]:
    failures.append(f"implausible MTP losses (expected ~ln(vocab) at first, falling): {m}")

# 2. TP2 + SP x DP2, PP2 x DP2, a layout with 'm'
tp = train("tp2sp_dp2", 4, L + TP2_SP)
same_losses("TP2+SP x DP2", tp, one, 6)
same_mtp("TP2+SP x DP2", tp, one)
pp = train("pp2_dp2", 4, L + ["--pipeline-model-parallel-size", "2"])
same_losses("PP2 x DP2", pp, one, 6)
same_mtp("PP2 x DP2", pp, one)
lay = train("layout", 2, L + ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et|tmmL"])
same_losses("layout Et|tmmL", lay, one, 6)
same_mtp("layout Et|tmmL", lay, one)

# 2a. interleaved PP2 (a layout of 2 virtual stages a rank: the depths on the last rank's last chunk) x DP2 with the distributed optimizer
#     (the word embeddings' copy in a bucket of its own), and TP2 + SP with --tp-comm-overlap (eh_proj's ring
#     all-gather), against a 4-layer 1-rank run
L4 = [x for x in L]
L4[L4.index("--num-layers") + 1] = "4"
one4 = train("one4", None, L4)
for name, np_, flags in [("vpp2_dp2_distopt", 4, ["--pipeline-model-parallel-size", "2",
                                                 "--pipeline-model-parallel-layout", "Et|t|t|tmmL",
                                                 "--use-distributed-optimizer"]),
                         ("tp2sp_overlap", 2, [*TP2_SP, "--tp-comm-overlap"])]:
    d = train(name, np_, L4 + flags)
    same_losses(f"MTP {name}", d, one4, 6)
    same_mtp(f"MTP {name}", d, one4)

# 2b. context parallelism: the rolled tokens, labels and mask cross the CP ranks' chunks (the a2a form's contiguous
#     chunks; the p2p form's load-balanced pairs), with TP2 + SP, and per-token loss
for name, np_, flags in [("cp2", 2, ["--context-parallel-size", "2"]),
                         ("cp2_p2p", 2, ["--context-parallel-size", "2", "--cp-comm-type", "p2p"]),
                         ("cp4_p2p", 4, ["--context-parallel-size", "4", "--cp-comm-type", "p2p"]),
                         ("cp2_p2p_tp2sp", 4, ["--context-parallel-size", "2", "--cp-comm-type", "p2p", *TP2_SP])]:
    d = train(name, np_, L + flags)
    same_losses(f"MTP {name}", d, one, 6)
    same_mtp(f"MTP {name}", d, one)
pt1 = train("per_token_one", None, L + ["--calculate-per-token-loss"])
pt2 = train("per_token_cp2_dp2", 4, L + ["--calculate-per-token-loss", "--context-parallel-size", "2"])
same_losses("MTP per token CP2 x DP2", pt2, pt1, 6)
same_mtp("MTP per token CP2 x DP2", pt2, pt1)

# 3. tied embeddings (GPT-2 style with RoPE) at PP2
G = M + ["--position-embedding-type", "rope"] + MTP
g1 = train("gpt2_one", None, G)
g2 = train("gpt2_pp2", 2, G + ["--pipeline-model-parallel-size", "2"])
same_losses("tied PP2", g2, g1, 6)
same_mtp("tied PP2", g2, g1)

# 4. full recompute; MoE depths under expert parallelism
rc = train("recompute", None, L + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                   "--recompute-num-layers", "1"])
if losses(rc) != a or mtp_losses(rc) != m:
    failures.append(f"full recompute is not bit-exact: {losses(rc)} {mtp_losses(rc)} vs {a} {m}")
E = L + MOE + ["--moe-layer-freq", "[0,1]"]
e1 = train("moe_one", None, E)
e4 = train("moe_ep2_dp2", 4, E + ["--expert-model-parallel-size", "2"])
same_losses("MoE depths EP2 x DP2", e4, e1, 6)
same_mtp("MoE depths EP2 x DP2", e4, e1)

# 5. checkpoints
PP2 = L + ["--pipeline-model-parallel-size", "2"]
part = train("part", 2, PP2 + ["--exit-interval", "3"])
run([MCPP, "train", *PP2, "--load", part, "--save", part], np_=2)
full2 = train("pp2", 2, PP2)
if losses(part) != losses(full2) or mtp_losses(part) != mtp_losses(full2):
    failures.append(f"PP2 resume is not bit-exact: {losses(part)} vs {losses(full2)}")
part3 = train("part3", 2, PP2 + ["--exit-interval", "3"])
check_continued("PP2 checkpoint at 1 rank", part3, os.path.join(WORK, "cont1"), None, L, losses(one))
# the depths are part of the model: resuming without them is a named error (not their weights silently dropped);
# --use-checkpoint-args takes them from the checkpoint (the run then continues as with the flags)
part1 = train("part1", None, L + ["--exit-interval", "3"])
check_error("resume without MTP", ["train", *M, *LLAMA_GQA, "--load", part1], ["different model", "mtp_num_layers"])
uca = os.path.join(WORK, "use_ckpt_args")
shutil.copytree(part1, uca)
os.remove(os.path.join(uca, "metrics.jsonl"))
run([MCPP, "train", *M, *LLAMA_GQA, "--use-checkpoint-args", "--mtp-loss-scaling-factor", "0.3", "--load", uca,
     "--save", uca])
u = losses(uca)
if sorted(u) != [4, 5, 6] or any(not close(u[i], a[i]) for i in u) or not all(mtp_losses(uca).values()):
    failures.append(f"--use-checkpoint-args of an MTP checkpoint continued: {u} {mtp_losses(uca)} vs {a}")
conv = os.path.join(WORK, "conv")
run([MCPP, "ckpt", "convert", "--load", part1, "--tp", "1", "--pp", "2", "--output", conv])
run([MCPP, "train", *PP2, "--load", conv, "--save", conv], np_=2)
c = losses(conv)
if sorted(c) != [4, 5, 6] or any(not close(c[i], a[i]) for i in c):
    failures.append(f"the 1-rank checkpoint converted to PP2 continued: {c} vs {a}")

# 6. memory plans
check_memory_plan("MTP TP2+SP x DP2", tp, 4, L + TP2_SP, 1)
check_memory_plan("MTP PP2 x DP2", pp, 4, L + ["--pipeline-model-parallel-size", "2"], 2)

# 7. bad input
check_error("learned positions", ["train", *M, *MTP], ["mtp_num_layers", "learned_absolute"])
check_error("layout count", ["train", *L, "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                             "Et|tmL"], ["pipeline_model_parallel_layout", "mtp_num_layers=2"], np_=2)
check_error("layout place", ["train", *L, "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                             "Ettmm|L"], ["pipeline_model_parallel_layout", "'L'"], np_=2)
check_error("layout order", ["train", *L, "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                             "Etm|tmL"], ["pipeline_model_parallel_layout", "follow every transformer layer"],
            np_=2)
check_error("negative depths", ["train", *M, *LLAMA_GQA, "--mtp-num-layers", "-1"], ["mtp_num_layers"])
check_error("hf export", ["ckpt", "export", "--load", one, "--format", "hf-llama", "--output",
                          os.path.join(WORK, "hf")], ["mtp_num_layers", "hf-llama"])

for f in failures:
    print("FAIL", f)
print(f"mtp_check: {'FAIL' if failures else 'PASS'}")
sys.exit(1 if failures else 0)
