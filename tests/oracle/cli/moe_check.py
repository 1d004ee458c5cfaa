#!/usr/bin/env python3
"""Mixture-of-experts layers (`--num-experts`, moe/moe_layer.h) through `mcpp train`, single process and under
mpiexec, against the single-process run (the parallel-equivalence oracle, end to end).

usage: moe_check.py MCPP WORKDIR
  1. a GPT-2-style MoE model (4 experts, top-2, aux loss and z-loss) trains: finite losses that differ from the
     dense model's with the same seed;
  2. DP2, DP2 with the distributed optimizer (overlapped grad reduce and param gather), PP2, full recompute (the
     router and the dispatch re-run in backward) and a Llama-style MoE (SwiGLU experts, pre-softmax router, no
     biases) at DP2: every iteration's lm loss and the validation loss equal the 1-rank run's within 1e-5 relative;
  3. a run interrupted at 3 and resumed is bit-exact; a 1-rank checkpoint continues at DP2 (1e-5);
  4. bad input fails with one error naming the problem: top-k above the expert count, MoE with TP2, the
     allgather dispatcher, --expert-model-parallel-size 2 (EP runs only inside the layer so far), `mcpp plan
     memory` of a MoE model.
"""
import os
import sys

from cli_harness import MCPP, WORK, close, failures, losses, record_corpus, run, same_losses

record_corpus()
M = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
     "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
     "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--train-iters", "6", "--log-interval", "1",
     "--eval-interval", "3", "--eval-iters", "1", "--split", "90,10,0", "--hidden-dropout", "0",
     "--attention-dropout", "0", "--data-path", os.path.join(WORK, "c_text_document"), "--seed", "5",
     "--make-vocab-size-divisible-by", "128"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-aux-loss-coeff",
       "0.01", "--moe-z-loss-coeff", "0.001"]
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--moe-router-pre-softmax"]


def train(name, np_, flags, timeout=400):
    d = os.path.join(WORK, name)
    run([MCPP, "train", *flags, "--save", d], np_=np_, timeout=timeout)
    return d


def same(name, got_dir, ref_dir):
    same_losses(name, got_dir, ref_dir, 6)


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
llama_one = train("llama_one", None, [*M, *MOE, *LLAMA])
same("llama dp2", train("llama_dp2", 2, [*M, *MOE, *LLAMA]), llama_one)

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

# 4. bad input: one clear error, non-zero exit, no hang
for name, np_, cmd, words in (
        ("topk > experts", None, ["train", *M, "--num-experts", "2", "--moe-router-topk", "3"],
         ["moe_router_topk", "num_moe_experts"]),
        ("tp2", 2, ["train", *M, *MOE, "--tensor-model-parallel-size", "2", "--make-vocab-size-divisible-by", "64"],
         ["tensor_model_parallel_size"]),
        ("allgather", None, ["train", *M, *MOE, "--moe-token-dispatcher-type", "allgather"],
         ["moe_token_dispatcher_type", "alltoall"]),
        ("ep2", 2, ["train", *M, *MOE, "--expert-model-parallel-size", "2"], ["expert_model_parallel_size"]),
        ("plan", None, ["plan", "memory", "--world", "1", *M, *MOE], ["mixture-of-experts"])):
    p = run([MCPP, *cmd, *(["--save", os.path.join(WORK, "bad")] if cmd[0] == "train" else [])], np_=np_, expect=1,
            timeout=120)
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    if not errs or not all(w in errs[0] for w in words):
        failures.append(f"bad input ({name}): expected an error naming {words}, got {p.stderr[-1500:]!r}")

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print(f"MoE checks: PASS (losses {[round(v, 6) for _, v in sorted(losses(one).items())]})")
