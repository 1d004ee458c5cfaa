"""E02: TP1 vs TP2 with the same weights, input and RNG (Column / Row parallel linears, vocab-parallel CE).

Each repeat trains 2 steps at TP1 (1 rank) and TP2 + SP (2 ranks) from the same seed and the same padded
vocabulary (make_vocab_size_divisible_by 128 at TP1, 64 at TP2: both pad to the same size), saving after
each step, then runs `mcpp forward` (1 process: the TP2 checkpoint is resharded on load) on a fixed batch.
  logits error  max |logits(TP2 ckpt) - logits(TP1 ckpt)| after the 2 steps (and iteration 1's loss error,
                which is the forward of identical initial weights)
  grad error    iteration 1's grad-norm relative error
  step error    max |param(TP2) - param(TP1)| over every logical weight after steps 1 and 2 (assembled from
                the TP2 shards by global offset)
  checksums     the TP2 shards' xxh3 (manifest) are identical across repeats (the run is deterministic) and its
                logical keys / global shapes equal TP1's
Oracle: the single-rank run (DESIGN.md's central oracle), fp32 on CPU: losses 1e-5 relative, grad norm 1e-5,
params and logits 1e-4 absolute (Adam's first steps move each weight by ~lr; summation order differs per rank).
"""
import os

import ckpt
import runner
from runner import check

ID, TITLE = "E02", "TP1 vs TP2 equivalence"
KEY = ["loss_rel_err_it1", "grad_norm_rel_err_it1", "step_max_abs_err", "logits_max_abs_err"]
TOL = {"loss_rel_err_it1": 1e-5, "loss_rel_err_it2": 1e-5, "grad_norm_rel_err_it1": 1e-5,
       "step_max_abs_err": 1e-4, "logits_max_abs_err": 1e-4}


def model(s):
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads",
            str(s["heads"]), "--seq-length", str(s["seq"]), "--max-position-embeddings", str(s["seq"]),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(s["vocab"]), "--micro-batch-size", "2",
            "--global-batch-size", "4", "--lr", "1e-3", "--lr-warmup-iters", "1", "--train-iters", "2",
            "--log-interval", "1", "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--seed", "7", "--save-interval", "1", *s.get("device", [])]


TIERS = {
    "cpu": {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 250},
    "gpu": "TP2 needs 2 GPUs: run on a multi-GPU machine (nvidia-h100-x2)",
}


def broken(s):
    s["tp2_extra"] = ["--seed", "8"]  # not the same weights: the oracle must see it
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", s["vocab"], tokens=20000)
    ctx.tokens = os.path.join(ctx.work, "tokens.txt")
    with open(ctx.tokens, "w") as f:
        for i in range(2):
            f.write(" ".join(str((7 * i + 13 * j) % s["vocab"]) for j in range(s["seq"])) + "\n")
    ctx.sums = []


def train_and_forward(ctx, s, name, np_, flags):
    save = ctx.path(name, "ckpt")
    _, _, d = ctx.mcpp_run(name, ["train", *model(s), "--data-path", ctx.data, "--save", save, *flags], np_=np_)
    npy = ctx.path(name + "-fwd", "logits.npy")
    ctx.mcpp_run(name + "-fwd", ["forward", "--load", save, "--tokens", ctx.tokens, "--output", npy])
    steps = {r["iteration"]: r for r in runner.records(d, "train")}
    return save, steps, ckpt.read_npy(npy)


def weights(d):
    return ckpt.logical_tensors(d, keep=lambda k: not k.startswith(("optimizer", "exp_avg")))


def repeat(ctx, s):
    a_save, a, (sa, la) = train_and_forward(ctx, s, "tp1", 1, ["--make-vocab-size-divisible-by", "128"])
    b_save, b, (sb, lb) = train_and_forward(ctx, s, "tp2", 2, ["--tensor-model-parallel-size", "2",
                                                               "--sequence-parallel", "--make-vocab-size-divisible-by",
                                                               "64", *s.get("tp2_extra", [])])
    step_err, keys_ok = 0.0, True
    for it in (1, 2):
        wa, wb = weights(ckpt.iter_dir(a_save, it)), weights(ckpt.iter_dir(b_save, it))
        keys_ok &= sorted((k, v[0]) for k, v in wa.items()) == sorted((k, v[0]) for k, v in wb.items())
        for k in wa:
            if k in wb:
                step_err = max(step_err, ckpt.max_abs_diff(wa[k][1], wb[k][1]))
    ctx.sums.append(ckpt.shard_checksums(ckpt.iter_dir(b_save, 2)))
    ctx.keys_ok = getattr(ctx, "keys_ok", True) and keys_ok
    ctx.nshards = len(ctx.sums[-1])
    rel = runner.formulas.rel_err
    return {"loss_rel_err_it1": rel(b[1]["lm_loss"], a[1]["lm_loss"]),
            "loss_rel_err_it2": rel(b[2]["lm_loss"], a[2]["lm_loss"]),
            "grad_norm_rel_err_it1": rel(b[1]["grad_norm"], a[1]["grad_norm"]),
            "step_max_abs_err": step_err,
            "logits_max_abs_err": ckpt.max_abs_diff(la, lb) if sa == sb else float("inf"),
            "tp1_step_ms": a[2]["elapsed_ms_per_iter"], "tp2_step_ms": b[2]["elapsed_ms_per_iter"]}


def oracle(ctx, s, repeats):
    out = [check(f"{k} <= {t:g}", all(r[k] <= t for r in repeats), f"max over repeats {max(r[k] for r in repeats):.3g}")
           for k, t in TOL.items()]
    out.append(check("TP2 logical keys and global shapes = TP1's", ctx.keys_ok))
    out.append(check("TP2 shard checksums identical across repeats", all(x == ctx.sums[0] for x in ctx.sums),
                     f"{ctx.nshards} shards x {len(ctx.sums)} repeats"))
    return out


def negative(ctx, s):
    med = runner.formulas.median
    t1, t2 = med([r["tp1_step_ms"] for r in ctx.repeats]), med([r["tp2_step_ms"] for r in ctx.repeats])
    verdict = "does not help" if t2 > 0.97 * t1 else "helps"
    return (f"TP2 (2 CPU ranks) vs TP1 at h={s['hidden']}: TP2 {verdict} (step {t2:.2f} ms vs {t1:.2f} ms, "
            f"median of {len(ctx.repeats)} repeats).\n\nReason: each rank's GEMMs shrink to [s*b, h] x [h, h/2], "
            f"far below what a core needs to amortize a call, while every layer adds the SP all-gather / "
            f"reduce-scatter pair (and the machine has 2 shared cores).\n")


def report(s, summary, checks):
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\n## Errors vs the 1-rank run\n\n" +
            runner.stats_table(summary, list(TOL) + ["tp1_step_ms", "tp2_step_ms"], "{:.3g}"))
