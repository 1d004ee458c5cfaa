#!/usr/bin/env python3
"""Mixture-of-experts layers (`--num-experts`, transformer/moe/moe_layer.h) through `mcpp train`, single process and under
mpiexec, against the single-process run (the parallel-equivalence oracle, end to end).

usage: moe_check.py MCPP WORKDIR
  1. a GPT-2-style MoE model (4 experts, top-2, aux loss and z-loss) trains: finite losses that differ from the
     dense model's with the same seed; the log records carry load_balancing_loss (~1) and z_loss (> 0), equal at
     DP2 and DP2 x EP2, absent for the dense model;
  2. DP2, DP2 with the distributed optimizer (overlapped grad reduce and param gather), PP2, full recompute (the
     router and the dispatch re-run in backward) and a Llama-style MoE (SwiGLU experts, pre-softmax router, no
     biases) at DP2: every iteration's lm loss and the validation loss equal the 1-rank run's within 1e-5 relative;
     Expert parallelism: DP2 x EP2, DP4 x EP4, PP2 x DP2 x EP2, Llama-style EP2 (overlapped grad reduce) and
     EP2 / DP4 x EP2 with the distributed optimizer (expert state sharded over expert-DP) equal the 1-rank run too;
     so do TP2 + SP (expert TP 1; expert TP 2: moe_etp_check.py), TP2 + SP x DP2 x EP2, CP2 and CP2 x DP2 x EP2 +
     distributed optimizer (the router's load-balancing statistics summed over TP / CP), DP2 x EP2 with
     --calculate-per-token-loss and PP4 x VP2 x DP2 x EP2 (an expert buffer per model chunk; 8 layers) against
     their 1-rank runs;
     --moe-router-load-balancing-type none trains without (and logs no) load-balancing loss;
  3. a run interrupted at 3 and resumed is bit-exact; a 1-rank checkpoint continues at DP2 (1e-5); an EP2
     checkpoint resumes at EP2 bit-exact and continues at 1 rank, at EP4 and at DP4 x EP2 with the distributed
     optimizer (1e-5), and converted offline to PP2 (`mcpp ckpt convert`) at PP2; an EP2 distributed-optimizer
     checkpoint continues at 1 rank;
  4. the memory plan equals the measured activations and model state at EP 1 (1 rank, PP2, DP2 + distributed
     optimizer, Llama-style, TP2 + SP, CP2) and the model state under EP (`mcpp plan memory` names the experts);
  5. bad input fails with one error naming the problem: top-k above the expert count, MoE with TP2 without SP, the
     allgather dispatcher, experts not divisible by EP, EP without experts,
     `mcpp ckpt export --format hf-gpt2` of a MoE checkpoint, a --moe-layer-freq pattern of the wrong length, a
     shared expert without experts;
  6. --moe-layer-freq "[1,1,0,0]" (4 layers: the last two dense) with a shared expert
     (--moe-shared-expert-intermediate-size): PP2 (the second stage has no MoE layer), PP2 x DP2 x EP2 with and
     without the distributed optimizer (its grad norm joins the expert sums on the stage without experts) and
     TP2 + SP (the shared expert tensor parallel) equal the 1-rank run; a PP2 x DP2 x EP2 checkpoint continues at
     1 rank; the memory plan equals the measured activations (1 rank, PP2, TP2 + SP);
  7. token dropping (--moe-expert-capacity-factor 0.75): trains differently from dropless; padding to capacity
     gives the same losses; DP2 x EP2 (padded, "position" policy too) and PP2 x DP2 x EP2 with the distributed
     optimizer equal their 1-rank runs (capacity is per microbatch of local tokens, as Megatron's); the padded
     run's memory plan equals the measured activations; bad capacity flags fail by name;
     --moe-router-topk-scaling-factor 2.5 trains differently and DP2 x EP2 equals 1 rank;
  8. DeepSeek-V3's router (--moe-router-score-function sigmoid, --moe-router-num-groups / --moe-router-group-topk,
     routed scaling): another function than softmax and than ungrouped sigmoid routing; DP2 x EP2, TP2 + SP and
     PP2 x DP2 x EP2 + distributed optimizer equal 1 rank; with the z-loss another trajectory (z_loss logged), TP2 +
     SP equal to 1 rank; with --moe-router-enable-expert-bias another trajectory,
     DP2 x EP2 and TP2 + SP x DP2 x EP2 + distributed optimizer equal 1 rank, a resume is bit-exact (the biases
     checkpointed) and the checkpoint continues at DP2 x EP2; bad router flags fail by name;
  9. DeepSeek's sequence-wise balancing loss (--moe-router-load-balancing-type seq_aux_loss, micro batches of 2
     sequences): another trajectory than the switch loss, logged as seq_load_balancing_loss (~1, no
     load_balancing_loss); TP2 + SP, CP2 (each sequence's statistics summed over the split) and DP2 x EP2 with the
     sigmoid / group-limited router equal 1 rank and log the same loss; a 1-rank checkpoint continues at CP2.
  10. Megatron's sinkhorn routing (--moe-router-load-balancing-type sinkhorn, top-2 and top-1): another trajectory
     than the plain top-k with the same activation, no load-balancing loss logged; DP2 x EP2 and PP2 with full
     recompute (the router re-runs sinkhorn alike) equal 1 rank; an aux loss, a capacity or pre-softmax with it and an
     unknown type fail by name;
  11. selective recompute of the MoE layers (--recompute-modules core_attn moe): the same losses and logged router
     losses as without, at 1 rank and PP2 x DP2 x EP2 (the shared-expert pattern); the memory plan equals the
     measured activations, below the plain run's; the same for moe_act (the experts' activations re-run) and
     shared_experts (also at TP2 + SP), and for layernorm at TP2 + SP (planned as measured) and with moe at
     PP2 x DP2 x EP2; recompute modules without selective, moe_act without experts,
     shared_experts without a shared expert or an unimplemented Megatron module fail by name;
  12. --moe-per-layer-logging: the train records carry each MoE layer's router losses (the [1,1,0,0] pattern: layers
     0 and 1), whose mean is the logged value; equal per layer at PP2 x DP2 x EP2; the losses unchanged;
  13. the gated shared expert (--moe-shared-expert-gate): another trajectory; TP2 + SP and PP2 x DP2 x EP2 +
     distributed optimizer equal 1 rank; a 1-rank checkpoint continues at TP2 + SP; the memory plan is exact; the gate
     without a shared expert fails by name;
  14. training noise: --moe-input-jitter-eps 0.1 and --moe-router-force-load-balancing (random logits), each another
     trajectory than the plain run; with selective (moe) and full recompute the same losses (the re-run draws the
     same noise); interrupted at 3 and resumed bit-exact (the RNG streams checkpointed); the jittered run's memory
     plan equals the measured activations; a jitter outside [0, 1) and either flag without experts fail by name.
"""
import os
import re
import shutil
import sys

from cli_harness import (MCPP, MOE, MOE_LLAMA, STDOUT, WORK, check_continued, check_error, check_memory_plan,
                         close, failures, losses, record_corpus, records, run, same_losses, tiny_train_flags, train)

record_corpus()
M = tiny_train_flags(os.path.join(WORK, "c_text_document"))
LLAMA = MOE_LLAMA


def same(name, got_dir, ref_dir):
    same_losses(name, got_dir, ref_dir, 6)
    # the global grad norm too (each expert's grads counted once over EP / expert-DP; Adam hides its scale in the
    # losses); float32 partial sums reduced in another order: 1e-5
    g, r = ([x.get("grad_norm") for x in records(d, "train")] for d in (got_dir, ref_dir))
    if len(g) != len(r) or any(not close(x, y) for x, y in zip(g, r)):
        failures.append(f"{name}: grad norms differ from the reference: {g} vs {r}")


# 1. it trains, and the experts are in the function
one = train("one", None, [*M, *MOE])
dense = train("dense", None, M)
lo, ld = losses(one), losses(dense)
if len(lo) != 6 or any(not (v == v and abs(v) < 1e3) for v in lo.values()):
    failures.append(f"MoE run: losses {lo}")
if lo and ld and all(close(lo[i], ld.get(i), 1e-6) for i in lo):
    failures.append(f"MoE run: the same losses as the dense model {ld}")

# 2. parallel layouts equal 1 rank
same("dp2", train("dp2", 2, [*M, *MOE]), one)
same("dp2 distributed optimizer", train("dp2_distopt", 2, [*M, *MOE, "--use-distributed-optimizer",
                                                             "--overlap-grad-reduce", "--overlap-param-gather"]), one)
same("pp2", train("pp2", 2, [*M, *MOE, "--pipeline-model-parallel-size", "2"]), one)
same("full recompute", train("recompute", None, [*M, *MOE, "--recompute-granularity", "full", "--recompute-method",
                                                  "uniform", "--recompute-num-layers", "1"]), one)
# --calculate-per-token-loss (the router losses scaled as Megatron's with it) and interleaved pipeline stages (an
# expert buffer per model chunk): DP2 / PP2 x VP2 against their 1-rank runs
PER_TOKEN = ["--calculate-per-token-loss"]
same("per-token loss dp2 x ep2", train("pt_ep2", 2, [*M, *MOE, *PER_TOKEN, "--expert-model-parallel-size", "2"]),
     train("pt_one", None, [*M, *MOE, *PER_TOKEN]))
L8 = ["--num-layers", "8", "--global-batch-size", "16"]
same("pp4 x vp2 x dp2 x ep2", train("vp_ep2", 8, [*M, *MOE, *L8, "--pipeline-model-parallel-size", "4",
                                                 "--num-layers-per-virtual-pipeline-stage", "1",
                                                 "--expert-model-parallel-size", "2"]),
     train("vp_one", None, [*M, *MOE, *L8]))
# --moe-router-load-balancing-type none: no load-balancing loss (trained and logged), unlike the aux_loss run
none = train("lb_none", None, [*M, *MOE, "--moe-router-load-balancing-type", "none"])
if any("load_balancing_loss" in r for r in records(none, "train")) or losses(none) == losses(one):
    failures.append(f"load balancing none: {records(none, 'train')[:1]} / losses {losses(none)} vs {losses(one)}")
llama_one = train("llama_one", None, [*M, *MOE, *LLAMA])
same("llama dp2", train("llama_dp2", 2, [*M, *MOE, *LLAMA]), llama_one)

# expert parallelism: each rank holds E / ep experts, tokens travel by all-to-all (DP2 x EP2, DP4 x EP4, PP2 x DP2 x EP2)
EP2 = ["--expert-model-parallel-size", "2"]
same("ep2", train("ep2", 2, [*M, *MOE, *EP2]), one)
same("ep4", train("ep4", 4, [*M, *MOE, "--expert-model-parallel-size", "4"]), one)
same("pp2 x ep2", train("pp2_ep2", 4, [*M, *MOE, *EP2, "--pipeline-model-parallel-size", "2"]), one)
same("llama ep2", train("llama_ep2", 2, [*M, *MOE, *LLAMA, *EP2, "--overlap-grad-reduce"]), llama_one)
DISTOPT = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
# tensor (+ sequence) and context parallelism: each rank routes its own tokens; the load-balancing statistics are
# summed over TP / CP, so losses and grad norms equal the unsplit run's
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1",
       "--make-vocab-size-divisible-by", "64"]
CP2 = ["--context-parallel-size", "2"]
same("tp2 + sp", train("tp2", 2, [*M, *MOE, *TP2]), one)
same("tp2 + sp x dp2 x ep2", train("tp2_ep2", 4, [*M, *MOE, *TP2, *EP2]), one)
same("cp2", train("cp2", 2, [*M, *MOE, *CP2]), one)
same("cp2 x dp2 x ep2 distributed optimizer", train("cp2_ep2", 4, [*M, *MOE, *CP2, *EP2, *DISTOPT]), one)
same("ep2 distributed optimizer", train("ep2_distopt", 2, [*M, *MOE, *EP2, *DISTOPT]), one)
same("dp4 x ep2 distributed optimizer", train("ep2_dp4_distopt", 4, [*M, *MOE, *EP2, *DISTOPT]), one)

# the log line's router losses (Megatron's load_balancing_loss and z_loss: each loss over its coefficient, averaged
# over layers, microbatches and ranks): ~1 for the Switch loss of a near-uniform router, positive z; per-rank
# statistics, so DP2 and DP2 x EP2 (the same tokens per rank) log the same values
def moe_losses(d):
    return [(r.get("load_balancing_loss"), r.get("z_loss")) for r in records(d, "train")]


lb = moe_losses(one)
if len(lb) != 6 or any(a_ is None or z_ is None or not (0.9 < a_ < 1.5) or not z_ > 0 for a_, z_ in lb):
    failures.append(f"log line MoE losses at 1 rank: {lb}")
for x, y in zip(moe_losses(os.path.join(WORK, "dp2")), moe_losses(os.path.join(WORK, "ep2"))):
    if not (close(y[0], x[0]) and close(y[1], x[1])):
        failures.append(f"MoE losses DP2 {x} vs DP2 x EP2 {y}")
# a sequence split over TP (SP) or CP logs the unsplit sequence's losses (each rank's share summed)
for name in ("tp2", "cp2"):
    got = moe_losses(os.path.join(WORK, name))
    if len(got) != len(lb) or any(not (close(y[0], x[0]) and close(y[1], x[1])) for x, y in zip(lb, got)):
        failures.append(f"MoE losses at {name} {got} vs 1 rank {lb}")
line = [l for l in STDOUT["one"].splitlines() if " iteration " in l and "lm loss:" in l]
if not line or not re.search(r"\| lm loss: \S+ \| load_balancing_loss: \S+ \| z_loss: \S+ \| grad norm:", line[0]):
    failures.append(f"the MoE log line: {line[:1]}")
if any(k in r for r in records(dense, "train") for k in ("load_balancing_loss", "z_loss")):
    failures.append("a dense model logs MoE losses")

# 3. resume bit-exact; a 1-rank checkpoint continues at DP2
part = os.path.join(WORK, "part")
run([MCPP, "train", *M, *MOE, "--exit-interval", "3", "--save", part])
run([MCPP, "train", *M, *MOE, "--load", part, "--save", part])
a, b = losses(one), losses(part)
if any(b.get(i) != a[i] for i in a if i > 3):
    failures.append(f"MoE resume is not bit-exact: {b} vs {a}")
part2 = os.path.join(WORK, "part2")
run([MCPP, "train", *M, *MOE, "--exit-interval", "3", "--save", part2])
run([MCPP, "train", *M, *MOE, "--load", part2, "--save", part2], np_=2)
c = losses(part2)
if any(not close(c.get(i), a[i]) for i in a if i > 3):
    failures.append(f"1-rank MoE checkpoint continued at DP2: {c} vs {a}")
# an EP2 checkpoint (each rank wrote its experts) resumes at EP2 bit-exact, continues at 1 rank and at EP4
part3 = os.path.join(WORK, "part3")
run([MCPP, "train", *M, *MOE, *EP2, "--exit-interval", "3", "--save", part3], np_=2)
for name, np_, flags in (("EP2", 2, EP2), ("1 rank", None, []), ("EP4", 4, ["--expert-model-parallel-size", "4"]),
                         ("DP4 x EP2 distributed optimizer", 4, [*EP2, *DISTOPT])):
    d = os.path.join(WORK, "cont_" + name.replace(" ", "_"))
    shutil.copytree(part3, d)
    run([MCPP, "train", *M, *MOE, *flags, "--load", d, "--save", d], np_=np_)
    c = losses(d)
    ref, tol = (losses(os.path.join(WORK, "ep2")), 0) if name == "EP2" else (a, 1e-5)  # bit-exact vs its own run
    if not ref or any(c.get(i) is None or abs(c[i] - ref[i]) > tol * abs(ref[i]) for i in ref if i > 3):
        failures.append(f"EP2 checkpoint continued at {name}: {c} vs {ref}")

# offline resharding: the EP2 checkpoint converted to PP2 (`mcpp ckpt convert`) continues at PP2
conv = os.path.join(WORK, "conv_pp2")
run([MCPP, "ckpt", "convert", "--load", part3, "--iteration", "3", "--tp", "1", "--pp", "2", "--output", conv])
run([MCPP, "train", *M, *MOE, "--pipeline-model-parallel-size", "2", "--load", conv, "--save", conv], np_=2)
c = losses(conv)
if any(not close(c.get(i), a[i]) for i in a if i > 3):
    failures.append(f"EP2 checkpoint converted to PP2 and continued: {c} vs {a}")

# an EP2 checkpoint of the distributed optimizer (expert moments sharded over expert-DP) continues at 1 rank
part4 = os.path.join(WORK, "part4")
run([MCPP, "train", *M, *MOE, *EP2, *DISTOPT, "--exit-interval", "3", "--save", part4], np_=2)
run([MCPP, "train", *M, *MOE, "--load", part4, "--save", part4])
c = losses(part4)
if any(not close(c.get(i), a[i]) for i in a if i > 3):
    failures.append(f"EP2 distributed-optimizer checkpoint continued at 1 rank: {c} vs {a}")

# the memory plan of MoE runs equals what the ranks measured (EP 1: exactly n*k routed rows a layer); under EP the
# plan assumes balanced routing, so only the model state is compared there (the experts' share: E / ep)
check_memory_plan("MoE 1 rank", one, 1, [*M, *MOE], 1)
check_memory_plan("MoE PP2", os.path.join(WORK, "pp2"), 2, [*M, *MOE, "--pipeline-model-parallel-size", "2"], 2)
check_memory_plan("MoE DP2 distributed optimizer", os.path.join(WORK, "dp2_distopt"), 2,
                  [*M, *MOE, "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"], 1)
check_memory_plan("MoE Llama", llama_one, 1, [*M, *MOE, *LLAMA], 1)
check_memory_plan("MoE TP2 + SP", os.path.join(WORK, "tp2"), 2, [*M, *MOE, *TP2], 1)
check_memory_plan("MoE CP2", os.path.join(WORK, "cp2"), 2, [*M, *MOE, *CP2], 1)
for name, world, flags in (("ep2", 2, [*M, *MOE, *EP2]), ("ep2_dp4_distopt", 4, [*M, *MOE, *EP2, *DISTOPT])):
    mem = records(os.path.join(WORK, name), "pipeline_activation_memory")
    for st in (mem[-1]["stages"] if mem else [None]):
        m, p = (st or {}).get("model_state_bytes", 0), (st or {}).get("planned_model_state_bytes", -1)
        if not (0 < p <= m <= p + p // 1000):
            failures.append(f"memory plan, {name}: model state measured {m} vs planned {p}")
    text = run([MCPP, "plan", "memory", "--world", str(world), *flags]).stdout
    if "(4 experts, ep 2)" not in text:
        failures.append(f"`mcpp plan memory` of {name} does not name the experts: {text[:300]!r}")

# 5. bad input: one clear error, non-zero exit, no hang
for name, np_, cmd, words in (
        ("topk > experts", None, ["train", *M, "--num-experts", "2", "--moe-router-topk", "3"],
         ["moe_router_topk", "num_moe_experts"]),
        ("tp2 without sp", 2, ["train", *M, *MOE, "--tensor-model-parallel-size", "2",
                               "--make-vocab-size-divisible-by", "64"], ["tensor_model_parallel_size", "sequence-parallel"]),
        ("allgather", None, ["train", *M, *MOE, "--moe-token-dispatcher-type", "allgather"],
         ["moe_token_dispatcher_type", "alltoall"]),
        ("experts % ep", 2, ["train", *M, "--num-experts", "3", "--moe-router-topk", "1", *EP2],
         ["num_moe_experts", "expert_model_parallel_size"]),
        ("ep without experts", 2, ["train", *M, *EP2], ["expert_model_parallel_size", "--num-experts"]),
        ("hf export", None, ["ckpt", "export", "--load", os.path.join(WORK, "one"), "--format", "hf-gpt2", "--output",
                             os.path.join(WORK, "hf")], ["mixture-of-experts", "hf-gpt2"]),
        ("layer pattern length", None, ["train", *M, *MOE, "--moe-layer-freq", "[1,0,1]"],
         ["moe_layer_freq", "3 entries", "num_layers 2"]),
        ("shared expert without experts", None, ["train", *M, "--moe-shared-expert-intermediate-size", "16"],
         ["moe_shared_expert_intermediate_size", "--num-experts"]),
        ("shared expert % tp", 2, ["train", *M, *MOE, *TP2, "--moe-shared-expert-intermediate-size", "25"],
         ["moe_shared_expert_intermediate_size", "tensor_model_parallel_size"]),
        ("pad without capacity", None, ["train", *M, *MOE, "--moe-pad-expert-input-to-capacity"],
         ["moe_pad_expert_input_to_capacity", "--moe-expert-capacity-factor"]),
        ("negative capacity", None, ["train", *M, *MOE, "--moe-expert-capacity-factor", "-1"],
         ["moe_expert_capacity_factor", ">= 0"]),
        ("drop policy", None, ["train", *M, *MOE, "--moe-expert-capacity-factor", "1", "--moe-token-drop-policy",
                               "random"], ["moe_token_drop_policy", "probs|position"])):
    check_error(name, [*cmd, *(["--save", os.path.join(WORK, "bad")] if cmd[0] == "train" else [])], words, np_)

# 6. MoE in some layers only (--moe-layer-freq), with a shared expert: the second pipeline stage has no MoE layer
FS = ["--num-layers", "4", "--moe-layer-freq", "[1,1,0,0]", "--moe-shared-expert-intermediate-size", "24"]
PP2 = ["--pipeline-model-parallel-size", "2"]
fs_one = train("fs_one", None, [*M, *MOE, *FS])
if losses(fs_one) == losses(train("fs_all", None, [*M, *MOE, "--num-layers", "4"])):
    failures.append("--moe-layer-freq [1,1,0,0] with a shared expert: the losses of all-MoE layers without one")
same("freq + shared pp2", train("fs_pp2", 2, [*M, *MOE, *FS, *PP2]), fs_one)
same("freq + shared pp2 x dp2 x ep2", train("fs_pp2_ep2", 4, [*M, *MOE, *FS, *PP2, *EP2]), fs_one)
same("freq + shared pp2 x dp2 x ep2 distributed optimizer",
     train("fs_pp2_ep2_distopt", 4, [*M, *MOE, *FS, *PP2, *EP2, *DISTOPT]), fs_one)
same("freq + shared tp2 + sp", train("fs_tp2", 2, [*M, *MOE, *FS, *TP2]), fs_one)
fs_part = os.path.join(WORK, "fs_part")
run([MCPP, "train", *M, *MOE, *FS, *PP2, *EP2, "--exit-interval", "3", "--save", fs_part], np_=4)
run([MCPP, "train", *M, *MOE, *FS, "--load", fs_part, "--save", fs_part])
c, a = losses(fs_part), losses(fs_one)
if not a or any(not close(c.get(i), a[i]) for i in a if i > 3):
    failures.append(f"freq + shared PP2 x DP2 x EP2 checkpoint continued at 1 rank: {c} vs {a}")
check_memory_plan("freq + shared 1 rank", fs_one, 1, [*M, *MOE, *FS], 1)
check_memory_plan("freq + shared PP2", os.path.join(WORK, "fs_pp2"), 2, [*M, *MOE, *FS, *PP2], 2)
check_memory_plan("freq + shared TP2 + SP", os.path.join(WORK, "fs_tp2"), 2, [*M, *MOE, *FS, *TP2], 1)

# 7. token dropping: each expert keeps ceil(32 tokens x 2 / 4 x 0.75) = 12 of a microbatch's routes
CAP = ["--moe-expert-capacity-factor", "0.75"]
PAD = ["--moe-pad-expert-input-to-capacity"]
POS = ["--moe-token-drop-policy", "position"]
cap_one = train("cap_one", None, [*M, *MOE, *CAP])
if losses(cap_one) == losses(one):
    failures.append("capacity factor 0.75: the dropless run's losses (nothing dropped?)")
same("capacity padded (the same math)", train("cap_pad", None, [*M, *MOE, *CAP, *PAD]), cap_one)
same("capacity padded dp2 x ep2", train("cap_pad_ep2", 2, [*M, *MOE, *CAP, *PAD, *EP2]), cap_one)
same("capacity pp2 x dp2 x ep2 distributed optimizer",
     train("cap_pp2_ep2", 4, [*M, *MOE, *CAP, *EP2, *PP2, *DISTOPT]), cap_one)
pos_one = train("cap_pos_one", None, [*M, *MOE, *CAP, *POS])
if losses(pos_one) == losses(cap_one):
    failures.append("drop policy position: the probs policy's losses")
same("capacity position padded dp2 x ep2", train("cap_pos_ep2", 2, [*M, *MOE, *CAP, *POS, *PAD, *EP2]), pos_one)
# --moe-router-topk-scaling-factor: the combine weights scaled (another function), EP2 = 1 rank
SCALE = ["--moe-router-topk-scaling-factor", "2.5"]
scale_one = train("scale_one", None, [*M, *MOE, *SCALE])
if losses(scale_one) == losses(one):
    failures.append("topk scaling factor 2.5: the unscaled run's losses")
same("scaling factor dp2 x ep2", train("scale_ep2", 2, [*M, *MOE, *SCALE, *EP2]), scale_one)
check_memory_plan("capacity padded 1 rank", os.path.join(WORK, "cap_pad"), 1, [*M, *MOE, *CAP, *PAD], 1)

# 8. DeepSeek-V3's router: sigmoid scores, group-limited routing (4 experts in 2 groups, each token's 2 experts from
# its best group), routed scaling. Another function than softmax routing; DP2 x EP2 (each
# rank one group's experts), TP2 + SP and PP2 x DP2 x EP2 + distributed optimizer equal 1 rank
DSV3 = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-aux-loss-coeff",
        "0.01", "--moe-router-score-function", "sigmoid", "--moe-router-num-groups", "2", "--moe-router-group-topk",
        "1", "--moe-router-topk-scaling-factor", "2.5"]
ds_one = train("ds_one", None, [*M, *DSV3])
if losses(ds_one) == losses(scale_one) or not losses(ds_one):
    failures.append(f"sigmoid + group-limited routing: {losses(ds_one)} (the softmax router's, or none)")
sig_one = train("sig_one", None, [*M, *DSV3[:-6], *DSV3[-2:]])  # sigmoid, no groups
if losses(sig_one) == losses(ds_one):
    failures.append("group-limited routing: the ungrouped run's losses (no group limit applied?)")
same("sigmoid + groups dp2 x ep2", train("ds_ep2", 2, [*M, *DSV3, *EP2]), ds_one)
same("sigmoid + groups tp2 + sp", train("ds_tp2", 2, [*M, *DSV3, *TP2]), ds_one)
same("sigmoid + groups pp2 x dp2 x ep2 distributed optimizer",
     train("ds_pp2_ep2", 4, [*M, *DSV3, *EP2, *PP2, *DISTOPT]), ds_one)
# the z-loss with sigmoid scores (on the logits' logsumexp, Megatron's apply_z_loss): another trajectory, logged;
# TP2 + SP (its token count over the split) equals 1 rank
ZL = ["--moe-z-loss-coeff", "0.01"]
dsz_one = train("dsz_one", None, [*M, *DSV3, *ZL])
if losses(dsz_one) == losses(ds_one) or not all(r.get("z_loss", 0) > 0 for r in records(dsz_one, "train")):
    failures.append(f"sigmoid + z-loss: {losses(dsz_one)}, z {[r.get('z_loss') for r in records(dsz_one, 'train')]}")
same("sigmoid + z-loss tp2 + sp", train("dsz_tp2", 2, [*M, *DSV3, *ZL, *TP2]), dsz_one)
# the expert bias (aux-loss-free balancing, updated after every step from the step's route counts summed over the
# ranks): another trajectory than without it; DP2 x EP2 and TP2 + SP x DP2 x EP2 + distributed optimizer equal 1
# rank (the counts summed over TP / DP); the biases are checkpointed: a run stopped at 3 resumes bit-exact, and its
# checkpoint continues at DP2 x EP2
BIAS = ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.05"]
bias_one = train("bias_one", None, [*M, *DSV3, *BIAS])
if losses(bias_one) == losses(ds_one) or not losses(bias_one):
    failures.append(f"expert bias: {losses(bias_one)} (the run without it, or none)")
same("expert bias dp2 x ep2", train("bias_ep2", 2, [*M, *DSV3, *BIAS, *EP2]), bias_one)
same("expert bias tp2 + sp x dp2 x ep2 distributed optimizer",
     train("bias_tp2_ep2", 4, [*M, *DSV3, *BIAS, *TP2, *EP2, *DISTOPT]), bias_one)
bias_part = os.path.join(WORK, "bias_part")
run([MCPP, "train", *M, *DSV3, *BIAS, "--exit-interval", "3", "--save", bias_part])
check_continued("expert bias, 1 rank -> DP2 x EP2", bias_part, bias_part + "_ep2", 2, [*M, *DSV3, *BIAS, *EP2],
                losses(bias_one))
run([MCPP, "train", *M, *DSV3, *BIAS, "--load", bias_part, "--save", bias_part])
a, b = losses(bias_one), losses(bias_part)
if len(a) != 6 or any(b.get(i) != a[i] for i in a):
    failures.append(f"expert bias: resume is not bit-exact (the biases not restored?): {b} vs {a}")
for name, cmd, words in (
        ("expert bias + softmax", [*M, *MOE, "--moe-router-enable-expert-bias"],
         ["moe_router_enable_expert_bias", "sigmoid"]),
        ("score function", [*M, *MOE, "--moe-router-score-function", "tanh"], ["moe_router_score_function", "tanh"]),
        ("router dtype", [*M, *MOE, "--moe-router-dtype", "fp64"], ["moe_router_dtype", "fp64"]),
        ("groups without group topk", [*M, *MOE, "--moe-router-num-groups", "2"],
         ["moe_router_num_groups", "moe_router_group_topk"]),
        ("groups % experts", [*M, *MOE, "--moe-router-num-groups", "3", "--moe-router-group-topk", "1"],
         ["moe_router_num_groups", "divide num_moe_experts"]),
        ("group topk > topk", [*M, *MOE, "--moe-router-num-groups", "4", "--moe-router-group-topk", "3"],
         ["moe_router_group_topk", "moe_router_topk = 2"])):
    check_error(name, ["train", *cmd, "--save", os.path.join(WORK, "bad")], words, None)

# --moe-router-dtype fp32 on an fp32 model: the same GEMM, so the same run (bf16 models: tests/cuda/moe_test.cpp)
same("router dtype fp32 (fp32 model)", train("router_fp32", None, [*M, *MOE, "--moe-router-dtype", "fp32"]), one)

# 9. the sequence-wise loss (DeepSeek-V2/V3's complementary balance loss): per sequence of each micro batch of 2
SEQ = ["--moe-router-load-balancing-type", "seq_aux_loss"]
seq_one = train("seq_one", None, [*M, *MOE, *SEQ])
if not losses(seq_one) or losses(seq_one) == losses(one):
    failures.append(f"seq_aux_loss: {losses(seq_one)} (the switch loss's trajectory, or none)")
seq_lb = [(r.get("seq_load_balancing_loss"), r.get("load_balancing_loss")) for r in records(seq_one, "train")]
if len(seq_lb) != 6 or any(v is None or w is not None or not 0.9 < v < 2.0 for v, w in seq_lb):
    failures.append(f"seq_aux_loss log records (seq_load_balancing_loss, load_balancing_loss): {seq_lb}")
line = [l for l in STDOUT["seq_one"].splitlines() if " iteration " in l and "lm loss:" in l]
if not line or not re.search(r"\| seq_load_balancing_loss: \S+ \| z_loss: \S+ \|", line[0]):
    failures.append(f"the seq_aux_loss log line: {line[:1]}")
for name, np_, flags in (("tp2 + sp", 2, TP2), ("cp2", 2, CP2)):
    got = train("seq_" + name.split()[0], np_, [*M, *MOE, *SEQ, *flags])
    same("seq_aux_loss " + name, got, seq_one)
    g = [r.get("seq_load_balancing_loss") for r in records(got, "train")]
    if len(g) != len(seq_lb) or any(not close(x, y[0]) for x, y in zip(g, seq_lb)):
        failures.append(f"seq_aux_loss {name} logs {g}, 1 rank {[v for v, _ in seq_lb]}")
seq_ds = train("seq_ds_one", None, [*M, *DSV3, *SEQ])
same("seq_aux_loss sigmoid + groups dp2 x ep2", train("seq_ds_ep2", 2, [*M, *DSV3, *SEQ, *EP2]), seq_ds)
seq_part = os.path.join(WORK, "seq_part")
run([MCPP, "train", *M, *MOE, *SEQ, "--exit-interval", "3", "--save", seq_part])
check_continued("seq_aux_loss, 1 rank -> CP2", seq_part, seq_part + "_cp2", 2, [*M, *MOE, *SEQ, *CP2],
                losses(seq_one))

# 10. Megatron's sinkhorn routing (no load-balancing loss): the experts by sinkhorn(logits) of each rank's micro batch
# in training (the plain top-k in evaluation), probs from the softmax (top-2) / sigmoid (top-1) of the logits
SINK = ["--num-experts", "4", "--moe-ffn-hidden-size", "48", "--moe-z-loss-coeff", "0.001",
        "--moe-router-load-balancing-type", "sinkhorn"]
for k in ("2", "1"):
    sink_one = train("sink_one_k" + k, None, [*M, *SINK, "--moe-router-topk", k])
    plain = train("sink_none_k" + k, None, [*M, *SINK, "--moe-router-topk", k, "--moe-router-load-balancing-type",
                                            "none", *(["--moe-router-score-function", "sigmoid"] if k == "1" else
                                                      ["--moe-router-pre-softmax"])])
    if not losses(sink_one) or losses(sink_one) == losses(plain):
        failures.append(f"sinkhorn top-{k}: {losses(sink_one)} (the plain top-k's trajectory, or none)")
    if any("load_balancing_loss" in r for r in records(sink_one, "train")):
        failures.append(f"sinkhorn top-{k} logs a load-balancing loss: {records(sink_one, 'train')[:1]}")
    same(f"sinkhorn top-{k} dp2 x ep2", train("sink_ep2_k" + k, 2, [*M, *SINK, "--moe-router-topk", k, *EP2]), sink_one)
same("sinkhorn pp2 + full recompute (re-routed alike)",
     train("sink_pp2_rc", 2, [*M, *SINK, "--moe-router-topk", "2", "--pipeline-model-parallel-size", "2",
                              "--recompute-granularity", "full", "--recompute-method", "uniform",
                              "--recompute-num-layers", "1"]),
     os.path.join(WORK, "sink_one_k2"))

# 11. selective recompute of the MoE layers (--recompute-modules moe; Megatron's moe_layer_recompute): the router,
# the dispatch (its all-to-alls under EP) and the experts re-run in backward — the same losses as the plain run (the
# logged router losses counted once), at 1 rank and at PP2 x DP2 x EP2 with the shared-expert pattern; the memory
# plan equals the (smaller) measured activations
RC_MOE = ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe"]
rc_moe = train("rc_moe", None, [*M, *MOE, *RC_MOE])
same("recompute moe", rc_moe, one)
if moe_losses(rc_moe) != moe_losses(one):
    failures.append(f"recompute moe logs router losses {moe_losses(rc_moe)} vs {moe_losses(one)}")
same("recompute moe pp2 x dp2 x ep2, freq + shared",
     train("rc_moe_fs", 4, [*M, *MOE, *FS, *PP2, *EP2, *RC_MOE]), fs_one)
plan = check_memory_plan("recompute moe", rc_moe, 1, [*M, *MOE, *RC_MOE], 1)
full = (records(one, "memory_plan") or [{}])[0]
pb = lambda p: p.get("stages", [{}])[0].get("peak_activation_bytes", 0)
if not 0 < pb(plan) < pb(full):
    failures.append(f"recompute moe: planned activations {pb(plan)} not below the plain run's {pb(full)}")
# --recompute-modules moe_act: the experts' activation outputs re-run from fc1's (kept) outputs: the same losses, the
# plan equal to the measurement and below the plain run's; shared_experts (the shared expert re-run in backward, its
# SP all-gather too) at 1 rank and TP2 + SP with the freq + shared pattern, planned as measured
RC_ACT = ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "moe_act"]
rc_act = train("rc_moe_act", None, [*M, *MOE, *RC_ACT])
same("recompute moe_act", rc_act, one)
plan = check_memory_plan("recompute moe_act", rc_act, 1, [*M, *MOE, *RC_ACT], 1)
if not 0 < pb(plan) < pb(full):
    failures.append(f"recompute moe_act: planned activations {pb(plan)} not below the plain run's {pb(full)}")
RC_SH = ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "shared_experts"]
rc_sh = train("rc_shared", None, [*M, *MOE, *FS, *RC_SH])
same("recompute shared_experts", rc_sh, fs_one)
same("recompute shared_experts tp2 + sp", train("rc_shared_tp2", 2, [*M, *MOE, *FS, *TP2, *RC_SH]), fs_one)
check_memory_plan("recompute shared_experts", rc_sh, 1, [*M, *MOE, *FS, *RC_SH], 1)
check_memory_plan("recompute shared_experts TP2 + SP", os.path.join(WORK, "rc_shared_tp2"), 2,
                  [*M, *MOE, *FS, *TP2, *RC_SH], 1)
# layernorm (the norms' outputs released: the router's and the shared expert's input, under SP its gathered copy;
# re-run and re-gathered in backward) at TP2 + SP with the freq + shared pattern, and with moe at PP2 x DP2 x EP2:
# the same losses, planned as measured
RC_LN = ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "layernorm"]
rc_ln = train("rc_ln_tp2", 2, [*M, *MOE, *FS, *TP2, *RC_LN])
same("recompute layernorm tp2 + sp", rc_ln, fs_one)
check_memory_plan("recompute layernorm TP2 + SP", rc_ln, 2, [*M, *MOE, *FS, *TP2, *RC_LN], 1)
same("recompute layernorm + moe pp2 x dp2 x ep2, freq + shared",
     train("rc_ln_moe_ep2", 4, [*M, *MOE, *FS, *PP2, *EP2, *RC_LN, "moe"]), fs_one)

# 12. --moe-per-layer-logging (the [1,1,0,0] pattern): each MoE layer's router losses in the train records (layers 0
# and 1 only), their mean the logged totals; the same per layer at PP2 x DP2 x EP2 (both on the first stage, the
# second stage's ranks adding nothing to them); the training itself unchanged
def per_layer(d):
    return [[(e["layer"], e.get("load_balancing_loss"), e.get("z_loss")) for e in r.get("moe_layers", [])]
            for r in records(d, "train")]


PL = ["--moe-per-layer-logging", "--moe-z-loss-coeff", "0.001"]
pl_one = train("pl_one", None, [*M, *MOE, *FS, *PL])
same("per-layer logging", pl_one, fs_one)
got = per_layer(pl_one)
if len(got) != 6 or any([l for l, _, _ in rec] != [0, 1] for rec in got):
    failures.append(f"--moe-per-layer-logging: per-layer records {got[:1]} (expected layers 0 and 1, 6 records)")
for rec, (lb_all, z_all) in zip(got, moe_losses(pl_one)):
    if not (close(sum(x[1] for x in rec) / 2, lb_all) and close(sum(x[2] for x in rec) / 2, z_all)):
        failures.append(f"--moe-per-layer-logging: the layers' mean {rec} is not the logged {lb_all}, {z_all}")
pl_par = per_layer(train("pl_pp2_ep2", 4, [*M, *MOE, *FS, *PP2, *EP2, *PL]))
if len(pl_par) != len(got) or any(len(a) != len(b) or any(x[0] != y[0] or not close(x[1], y[1]) or
                                                          not close(x[2], y[2]) for x, y in zip(a, b))
                                  for a, b in zip(pl_par, got)):
    failures.append(f"--moe-per-layer-logging at PP2 x DP2 x EP2: {pl_par[:1]} vs 1 rank {got[:1]}")

# 13. the gated shared expert (--moe-shared-expert-gate, Qwen-MoE's): another trajectory than the ungated one; TP2 + SP
# (the gate weight a sequence-parallel parameter: its grad summed over TP) and PP2 x DP2 x EP2 + distributed optimizer
# equal 1 rank; a 1-rank checkpoint continues at TP2 + SP; the memory plan equals the measured activations
GATE = ["--moe-shared-expert-gate"]
gate_one = train("gate_one", None, [*M, *MOE, *FS, *GATE])
if not losses(gate_one) or losses(gate_one) == losses(fs_one):
    failures.append(f"shared expert gate: {losses(gate_one)} (the ungated trajectory, or none)")
gate_tp2 = train("gate_tp2", 2, [*M, *MOE, *FS, *GATE, *TP2])
same("shared gate tp2 + sp", gate_tp2, gate_one)
same("shared gate pp2 x dp2 x ep2 distributed optimizer",
     train("gate_pp2_ep2", 4, [*M, *MOE, *FS, *GATE, *PP2, *EP2, *DISTOPT]), gate_one)
gate_part = os.path.join(WORK, "gate_part")
run([MCPP, "train", *M, *MOE, *FS, *GATE, "--exit-interval", "3", "--save", gate_part])
check_continued("shared gate, 1 rank -> TP2 + SP", gate_part, gate_part + "_tp2", 2, [*M, *MOE, *FS, *GATE, *TP2],
                losses(gate_one))
check_memory_plan("shared gate 1 rank", gate_one, 1, [*M, *MOE, *FS, *GATE], 1)
check_memory_plan("shared gate TP2 + SP", gate_tp2, 2, [*M, *MOE, *FS, *GATE, *TP2], 1)
# 14. training noise (Megatron's --moe-input-jitter-eps, --moe-router-force-load-balancing): other trajectories;
# recompute re-draws the same noise (selective moe, full); a resume continues the RNG streams bit-exact
for tag, noise in (("jitter", ["--moe-input-jitter-eps", "0.1"]), ("force", ["--moe-router-force-load-balancing"])):
    noisy = train(tag + "_one", None, [*M, *MOE, *noise])
    if not losses(noisy) or losses(noisy) == losses(one):
        failures.append(f"{tag}: {losses(noisy)} (the plain trajectory, or none)")
    same(f"{tag} selective recompute moe", train(tag + "_rc_moe", None, [*M, *MOE, *noise, *RC_MOE]), noisy)
    same(f"{tag} full recompute", train(tag + "_rc_full", None, [*M, *MOE, *noise, "--recompute-granularity", "full",
                                                                  "--recompute-method", "uniform",
                                                                  "--recompute-num-layers", "1"]), noisy)
    part = os.path.join(WORK, tag + "_part")
    run([MCPP, "train", *M, *MOE, *noise, "--exit-interval", "3", "--save", part])
    run([MCPP, "train", *M, *MOE, *noise, "--load", part, "--save", part])
    a, b = losses(noisy), losses(part)
    if len(b) != 6 or any(b.get(i) != a[i] for i in a if i > 3):
        failures.append(f"{tag}: resumed at 3 {b} vs uninterrupted {a} (not bit-exact)")
    if tag == "jitter":
        check_memory_plan("jitter 1 rank", noisy, 1, [*M, *MOE, *noise], 1)
for name, cmd, words in (
        ("jitter eps 1.5", [*M, *MOE, "--moe-input-jitter-eps", "1.5"], ["moe_input_jitter_eps", "[0, 1)", "1.5"]),
        ("jitter without experts", [*M, "--moe-input-jitter-eps", "0.1"], ["moe_input_jitter_eps", "--num-experts"]),
        ("random logits without experts", [*M, "--moe-router-force-load-balancing"],
         ["moe_router_force_load_balancing", "--num-experts"]),
        ("shared gate without a shared expert", [*M, *MOE, *GATE],
         ["moe_shared_expert_gate", "--moe-shared-expert-intermediate-size"]),
        ("per-layer logging without experts", [*M, "--moe-per-layer-logging"], ["moe_per_layer_logging"]),
        ("recompute modules without selective", [*M, *MOE, "--recompute-modules", "moe"],
         ["recompute_modules", "selective"]),
        ("unknown recompute module", [*M, *MOE, "--recompute-granularity", "selective", "--recompute-modules",
                                      "mlp_act"], ["recompute_modules", "'mlp_act' is not a module"]),
        ("mla_up_proj without MLA", [*M, *MOE, "--recompute-granularity", "selective", "--recompute-modules",
                                     "mla_up_proj"], ["recompute_modules mla_up_proj", "--multi-latent-attention"]),
        ("moe_act without experts", [*M, "--recompute-granularity", "selective", "--recompute-modules", "moe_act"],
         ["recompute_modules moe_act", "--num-experts"]),
        ("shared_experts without one", [*M, *MOE, "--recompute-granularity", "selective", "--recompute-modules",
                                        "shared_experts"], ["shared_experts", "--moe-shared-expert-intermediate-size"]),
        ("sinkhorn with an aux loss", [*M, *SINK, "--moe-aux-loss-coeff", "0.01"],
         ["sinkhorn", "--moe-aux-loss-coeff 0"]),
        ("sinkhorn with a capacity", [*M, *SINK, "--moe-expert-capacity-factor", "1", "--moe-router-pre-softmax"],
         ["sinkhorn", "--moe-expert-capacity-factor", "--moe-router-pre-softmax"]),
        ("unknown balancing", [*M, *MOE, "--moe-router-load-balancing-type", "sinkhorn2"],
         ["moe_router_load_balancing_type", "sinkhorn2"])):
    check_error(name, ["train", *cmd, "--save", os.path.join(WORK, "bad")], words, None)

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print(f"MoE checks: PASS (losses {[round(v, 6) for _, v in sorted(losses(one).items())]})")
