#!/usr/bin/env python3
"""Multi-latent attention (`mcpp train --multi-latent-attention`) under mpiexec against the single-process run.

usage: mla_check.py MCPP WORKDIR
  1. a Llama-style MLA model (query compression, latent norms, YaRN with a softmax mscale, value heads narrower than
     the query / key heads) trains at 1 rank with falling losses, other than the same model with plain RoPE;
  2. TP2 + SP x DP2, TP2 without SP, TP2 + SP with --tp-comm-overlap, PP2 x DP2 with the distributed optimizer and
     (without query compression) TP2 x PP2 equal 1 rank: every lm loss and validation loss (1e-5); so do CP2 and
     CP2 x TP2 + SP (all-to-all) and CP2 / CP4 (p2p, ring), with mla_up_proj + core_attn recompute bit for bit;
  3. selective recompute (core_attn + layernorm; mla_up_proj) and full recompute equal the plain run bit for bit, and
     mla_up_proj under TP2 + SP x DP2 (its memory plan equal to the measured) and with --tp-comm-overlap equals its
     plain run bit for bit too;
  4. a TP2 + SP checkpoint continues at 1 rank (the column-parallel down projections resharded; 1e-5) and resumes at
     TP2 bit-exact; resuming without --multi-latent-attention is a named error, --use-checkpoint-args continues;
  4a. configs/deepseek-v3-tiny.toml (MLA + MoE + MTP) trains, and at TP2 + SP x DP2 with EP2 equals 1 rank;
  5. the memory plan of the TP2 + SP x DP2, PP2 and context-parallel runs equals what their stages measured;
  6. bad input is one named error: MLA with learned absolute positions, a q_lora_rank TP does not divide, --rope-type
     without MLA or of an unknown type, heads TP x CP (a2a) does not divide, HF export of an MLA checkpoint.
"""
import os
import shutil
import sys

from cli_harness import (MCPP, TP2_SP, WORK, check_continued, check_error, check_memory_plan, failures, losses,
                         record_corpus, run, same_losses, tiny_train_flags, train)

data = record_corpus()
M = tiny_train_flags(data)
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear"]
MLA = ["--multi-latent-attention", "--q-lora-rank", "16", "--kv-lora-rank", "12", "--qk-head-dim", "8",
       "--qk-pos-emb-head-dim", "4", "--v-head-dim", "6", "--qk-layernorm", "--rope-type", "yarn",
       "--rotary-scaling-factor", "4", "--mscale", "0.9", "--mscale-all-dim", "0.7",
       "--original-max-position-embeddings", "8"]
L = M + LLAMA + MLA

# 1. one rank
one = train("one", None, L)
a = losses(one)
if len(a) != 6 or not (3.0 < a[1] < 12.0) or a[6] >= a[1]:
    failures.append(f"implausible MLA losses (expected ~ln(vocab) at first, falling): {a}")
i = L.index("--rope-type")
rope = train("rope", None, L[:i] + ["--rope-type", "rope"] + L[i + 2:])
if any(losses(rope).get(k) == a[k] for k in a):
    failures.append(f"--rope-type rope trains like yarn (the YaRN tables / mscale unused?): {losses(rope)} vs {a}")

# 2. tensor / sequence / pipeline / data parallel against 1 rank
tp = train("tp2sp_dp2", 4, L + TP2_SP)
same_losses("MLA TP2+SP x DP2", tp, one, 6)
TP2 = ["--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"]
same_losses("MLA TP2", train("tp2", 2, L + TP2), one, 6)
ovl = train("tp2sp_overlap", 2, L + TP2_SP + ["--tp-comm-overlap"])
same_losses("MLA TP2+SP tp-comm-overlap", ovl, one, 6)
# mla_up_proj re-runs the up projections per ring chunk, as the forward ran them: bit for bit
ovl_up = train("tp2sp_overlap_up_proj", 2, L + TP2_SP + ["--tp-comm-overlap", "--recompute-granularity", "selective",
                                                         "--recompute-modules", "mla_up_proj"])
if losses(ovl_up) != losses(ovl):
    failures.append(f"MLA mla_up_proj with --tp-comm-overlap is not bit-exact: {losses(ovl_up)} vs {losses(ovl)}")
L4 = [x for x in L]
L4[L4.index("--num-layers") + 1] = "4"
one4 = train("one4", None, L4)
pp = train("pp2_dp2_distopt", 4, L4 + ["--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"])
same_losses("MLA PP2 x DP2 distributed optimizer", pp, one4, 6)
NOQ = L4[:L4.index("--q-lora-rank")] + L4[L4.index("--q-lora-rank") + 2:]  # linear_q_proj
noq1 = train("noq_one", None, NOQ)
same_losses("MLA (no query compression) TP2 x PP2", train("noq_tp2_pp2", 4, NOQ + TP2 + [
    "--pipeline-model-parallel-size", "2"]), noq1, 6)

# 2a. context parallelism: RoPE and the MLA assembly on the rank's rows; a2a (query / key / value all-to-all'ed, the
#     whole sequence for n/cp heads), p2p (the ring on load-balanced rows), CP x TP2 + SP, and mla_up_proj under both
#     forms (the rebuilt query / key / value all-to-all'ed again): every loss equals 1 rank, the recompute bit for bit
cp_runs = {}
for name, np_, flags in [("cp2", 2, ["--context-parallel-size", "2"]),
                         ("cp2_p2p", 2, ["--context-parallel-size", "2", "--cp-comm-type", "p2p"]),
                         ("cp4_p2p", 4, ["--context-parallel-size", "4", "--cp-comm-type", "p2p"]),
                         ("cp2_tp2sp", 4, ["--context-parallel-size", "2", *TP2_SP])]:
    cp_runs[name] = (train(name, np_, L + flags), np_, flags)
    same_losses(f"MLA {name}", cp_runs[name][0], one, 6)
UP = ["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj", "core_attn"]
for name in ("cp2", "cp2_p2p"):
    d, np_, flags = cp_runs[name]
    r = train(name + "_up_proj", np_, L + flags + UP)
    if losses(r) != losses(d):
        failures.append(f"MLA {name} with mla_up_proj + core_attn recompute is not bit-exact: {losses(r)} vs {losses(d)}")

# 3. recompute: bit for bit
for name, flags in [("selective", ["--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                   "layernorm"]),
                    ("mla_up_proj", ["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"]),
                    ("full", ["--recompute-granularity", "full", "--recompute-method", "uniform",
                              "--recompute-num-layers", "1"])]:
    r = train(f"recompute_{name}", None, L + flags)
    if losses(r) != a:
        failures.append(f"MLA {name} recompute is not bit-exact: {losses(r)} vs {a}")

up = train("tp2sp_dp2_up_proj", 4, L + TP2_SP + ["--recompute-granularity", "selective", "--recompute-modules",
                                                  "mla_up_proj"])
if losses(up) != losses(tp):
    failures.append(f"MLA mla_up_proj recompute at TP2+SP x DP2 is not bit-exact: {losses(up)} vs {losses(tp)}")
check_memory_plan("MLA TP2+SP x DP2 mla_up_proj", up, 4, L + TP2_SP + ["--recompute-granularity", "selective",
                                                                     "--recompute-modules", "mla_up_proj"], 1)

# 4. checkpoints
part = train("part", 4, L + TP2_SP + ["--exit-interval", "3"])
check_continued("MLA TP2+SP checkpoint at 1 rank", part, os.path.join(WORK, "cont1"), None, L, a)
run([MCPP, "train", *L, *TP2_SP, "--load", part, "--save", part], np_=4)
if losses(part) != losses(tp):
    failures.append(f"MLA TP2+SP resume is not bit-exact: {losses(part)} vs {losses(tp)}")
part1 = train("part1", None, L + ["--exit-interval", "3"])
check_error("resume without MLA", ["train", *M, *LLAMA, "--load", part1], ["different model", "multi_latent_attention"])
uca = os.path.join(WORK, "use_ckpt_args")
shutil.copytree(part1, uca)
os.remove(os.path.join(uca, "metrics.jsonl"))
run([MCPP, "train", *M, *LLAMA, "--use-checkpoint-args", "--load", uca, "--save", uca])
u = losses(uca)
if sorted(u) != [4, 5, 6] or any(u[i] != a[i] for i in u):
    failures.append(f"--use-checkpoint-args of an MLA checkpoint continued: {u} vs {a}")

# 4a. the shipped DeepSeek-V3-style recipe (MLA + YaRN, sigmoid grouped MoE with expert bias and a shared expert after a
#     dense layer, one MTP depth) trains, and at TP2 + SP x DP2 (expert parallel 2) equals 1 rank
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DS3 = ["--config", os.path.join(ROOT, "configs", "deepseek-v3-tiny.toml"), "--data-path", data, "--train-iters", "6",
       "--log-interval", "1", "--eval-interval", "3", "--eval-iters", "1", "--split", "90,10,0", "--seed", "5",
       "--micro-batch-size", "2", "--global-batch-size", "8", "--seq-length", "16", "--max-position-embeddings", "16",
       "--make-vocab-size-divisible-by", "128", "--lr-warmup-iters", "1"]
ds1 = train("ds3_one", None, DS3)
d1 = losses(ds1)
if len(d1) != 6 or not (3.0 < d1[1] < 12.0) or d1[6] >= d1[1]:
    failures.append(f"the DeepSeek-V3-style recipe: implausible losses {d1}")
ds4 = train("ds3_tp2sp_ep2", 4, DS3 + TP2_SP + ["--expert-model-parallel-size", "2"])
same_losses("DeepSeek-V3-style recipe TP2+SP x DP2, EP2", ds4, ds1, 6)

# 5. memory plans
check_memory_plan("MLA TP2+SP x DP2", tp, 4, L + TP2_SP, 1)
check_memory_plan("MLA PP2 x DP2", pp, 4, L4 + ["--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"],
                  2)

for name, (d, np_, flags) in cp_runs.items():
    check_memory_plan(f"MLA {name}", d, np_, L + flags, 1)

# 6. bad input
check_error("learned positions", ["train", *M, *MLA], ["multi_latent_attention", "position-embedding-type rope"])
check_error("q_lora_rank vs TP", ["train", *L, *TP2_SP, "--q-lora-rank", "15"],
            ["q_lora_rank (15)", "tensor_model_parallel_size (2)"], np_=2)
check_error("rope type without MLA", ["train", *M, *LLAMA, "--rope-type", "yarn"], ["rope_type", "multi-latent"])
check_error("unknown rope type", ["train", *L, "--rope-type", "ntk"], ["rope_type", "'ntk'"])
check_error("context parallel heads", ["train", *L, "--context-parallel-size", "4", *TP2_SP],
            ["num_query_groups (4)", "context_parallel_size (8)"], np_=8)
check_error("hf export", ["ckpt", "export", "--load", one, "--format", "hf-llama", "--output",
                          os.path.join(WORK, "hf")], ["multi_latent_attention", "hf-llama"])

for f in failures:
    print("FAIL", f)
print(f"mla_check: {'FAIL' if failures else 'PASS'}")
sys.exit(1 if failures else 0)
