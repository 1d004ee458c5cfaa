#!/usr/bin/env python3
"""Expert tensor parallelism (`--expert-tensor-parallel-size`; Megatron's default: the TP size) through `mcpp train`:
each routed expert's fc1 rows / fc2 columns split over the expert-TP group, the token dispatcher all-gathering the
experts' input rows over it after the EP all-to-all and reduce-scattering their partial outputs
(transformer/moe/token_dispatcher.h), against the single-process run (the parallel-equivalence oracle, end to end).

usage: moe_etp_check.py MCPP WORKDIR
  1. TP2 + SP with the default expert TP (2), GELU experts with biases (fc2's bias added once) and Llama-style
     (SwiGLU: fc1's gate / up halves split separately, no biases); expert TP 2 at TP 1 (the expert-TP peers route
     different tokens, as data-parallel ranks); TP2 + SP x EP2 x expert TP 2 with the distributed optimizer
     (4 ranks: the expert state sharded over expert-DP); expert TP 4 at TP 1 (4 ranks); padded to capacity (the
     uniform plan: no count exchange) at expert TP 2: every iteration's lm loss, the validation losses and the grad
     norms (each expert shard counted once) equal the 1-rank run's within 1e-5 (padded at TP2 + SP, whose capacity
     comes from half the tokens: the expert TP 1 run's); the router losses logged equal too;
  2. checkpoints: a TP2 + SP (expert TP 2) run interrupted at 3 resumes bit-exact; its checkpoint (expert weights
     as expert-TP shards of the logical tensors) continues at 1 rank, and a 1-rank checkpoint continues at TP2 + SP
     x EP2 x expert TP 2 with the distributed optimizer;
  3. the memory plan equals the measured activations and model state (TP2 + SP expert TP 2, expert TP 2 at TP 1;
     the experts' rows gathered over expert TP, their FFN split); `mcpp plan memory` names the expert TP;
  4. bad input fails with one error naming the problem: moe_ffn_hidden_size not divisible by the expert TP, a
     world not divisible by expert TP x EP.
"""
import os

from cli_harness import (MCPP, MOE, MOE_LLAMA, WORK, check_continued, check_error, check_memory_plan, close,
                         failures, losses, record_corpus, records, run, same_losses, tiny_train_flags, train)

record_corpus()
M = tiny_train_flags(os.path.join(WORK, "c_text_document"))
LLAMA = MOE_LLAMA
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--make-vocab-size-divisible-by", "64"]
EP2 = ["--expert-model-parallel-size", "2"]
DISTOPT = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
PADDED = ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"]


def router_losses(d):
    return [(r.get("load_balancing_loss"), r.get("z_loss")) for r in records(d, "train")]


def same(name, got_dir, ref_dir):
    same_losses(name, got_dir, ref_dir, 6)
    g, r = ([x.get("grad_norm") for x in records(d, "train")] for d in (got_dir, ref_dir))
    if len(g) != 6 or len(g) != len(r) or any(not close(x, y) for x, y in zip(g, r)):
        failures.append(f"{name}: grad norms differ from the reference: {g} vs {r}")
    g, r = router_losses(got_dir), router_losses(ref_dir)
    if len(g) != len(r) or any(not (close(x[0], y[0]) and close(x[1], y[1])) for x, y in zip(g, r)):
        failures.append(f"{name}: logged router losses {g} vs {r}")


# 1. layouts with expert TP equal 1 rank
one = train("one", None, [*M, *MOE])
tp2 = train("tp2", 2, [*M, *MOE, *TP2])
same("tp2 + sp, expert tp 2 (the default)", tp2, one)
same("tp2 + sp, expert tp 1", train("tp2_etp1", 2, [*M, *MOE, *TP2, "--expert-tensor-parallel-size", "1"]), one)
llama_one = train("llama_one", None, [*M, *MOE, *LLAMA])
same("llama tp2 + sp, expert tp 2", train("llama_tp2", 2, [*M, *MOE, *LLAMA, *TP2]), llama_one)
etp2 = train("etp2", 2, [*M, *MOE, "--expert-tensor-parallel-size", "2"])
same("expert tp 2 at tp 1", etp2, one)
same("expert tp 4 at tp 1", train("etp4", 4, [*M, *MOE, "--expert-tensor-parallel-size", "4"]), one)
same("tp2 + sp x ep2 x expert tp 2 distributed optimizer", train("tp2_ep2", 4, [*M, *MOE, *TP2, *EP2, *DISTOPT]),
     one)
# padded: the capacity comes from the rank's own tokens (Megatron's), so expert TP 2 at TP 1 (each rank a micro
# batch, as 1 rank) equals 1 rank, and TP2 + SP (half the tokens a rank) at expert TP 2 equals it at expert TP 1
padded_one = train("padded_one", None, [*M, *MOE, *PADDED])
same("padded expert tp 2 at tp 1", train("padded_etp2", 2, [*M, *MOE, *PADDED, "--expert-tensor-parallel-size", "2"]),
     padded_one)
same("padded tp2 + sp, expert tp 2 vs expert tp 1", train("padded_tp2", 2, [*M, *MOE, *PADDED, *TP2]),
     train("padded_tp2_etp1", 2, [*M, *MOE, *PADDED, *TP2, "--expert-tensor-parallel-size", "1"]))
if losses(padded_one) == losses(one):
    failures.append("padded to capacity 1.0: the dropless run's losses (nothing dropped?)")

# 2. checkpoints: bit-exact resume at TP2 (expert TP 2); continued at 1 rank; a 1-rank checkpoint continued at
# TP2 x EP2 x expert TP 2 with the distributed optimizer
part = os.path.join(WORK, "part_tp2")
run([MCPP, "train", *M, *MOE, *TP2, "--exit-interval", "3", "--save", part], np_=2)
run([MCPP, "train", *M, *MOE, *TP2, "--load", part, "--save", part], np_=2)
a, b = losses(tp2), losses(part)
if not a or any(b.get(i) != a[i] for i in a if i > 3):
    failures.append(f"TP2 (expert TP 2) resume is not bit-exact: {b} vs {a}")
part = os.path.join(WORK, "part_tp2b")
run([MCPP, "train", *M, *MOE, *TP2, "--exit-interval", "3", "--save", part], np_=2)
check_continued("TP2 expert TP 2 -> 1 rank", part, os.path.join(WORK, "cont_one"), None, [*M, *MOE], losses(one))
part = os.path.join(WORK, "part_one")
run([MCPP, "train", *M, *MOE, "--exit-interval", "3", "--save", part])
check_continued("1 rank -> TP2 x EP2 x expert TP 2 distributed optimizer", part, os.path.join(WORK, "cont_tp2_ep2"),
                4, [*M, *MOE, *TP2, *EP2, *DISTOPT], losses(one))

# 3. the memory plan equals the measurement
check_memory_plan("TP2 + SP expert TP 2", tp2, 2, [*M, *MOE, *TP2], 1)
check_memory_plan("expert TP 2 at TP 1", etp2, 2, [*M, *MOE, "--expert-tensor-parallel-size", "2"], 1)
check_memory_plan("padded TP2 + SP expert TP 2", os.path.join(WORK, "padded_tp2"), 2, [*M, *MOE, *PADDED, *TP2], 1)
text = run([MCPP, "plan", "memory", "--world", "4", *M, *MOE, *TP2, *EP2]).stdout
if "(4 experts, ep 2, expert tp 2)" not in text:
    failures.append(f"`mcpp plan memory` does not name the expert TP: {text[:300]!r}")

# 4. bad input: one clear error, non-zero exit, no hang
for name, np_, cmd, words in (
        ("ffn % expert tp", 2, ["train", *M, *MOE, "--moe-ffn-hidden-size", "45", *TP2],
         ["moe_ffn_hidden_size", "expert_tensor_parallel_size"]),
        ("world % expert tp x ep", 2, ["train", *M, *MOE, *EP2, "--expert-tensor-parallel-size", "2"],
         ["expert_tensor_parallel_size", "expert_model_parallel_size"])):
    check_error(name, [*cmd, "--save", os.path.join(WORK, "bad")], words, np_)

if failures:
    print("\n".join(failures))
    raise SystemExit(1)
print("moe_etp_check: all checks passed")
