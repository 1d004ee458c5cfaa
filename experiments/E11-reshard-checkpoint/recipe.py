"""E11: save at TP2 x PP2, restore at TP1 x PP4 and TP1 x PP1 — with Megatron's default flags.

The model uses GPT-2's vocabulary size (50257, NullTokenizer) and the default --make-vocab-size-divisible-by 128,
so the TP2 save pads it to 50432 and a TP1 run would pad to 50304: the restore adopts the checkpoint's 50432
(a multiple of 128 x 1; training/checkpointing.h adopt_checkpoint_vocab_padding) and logs it.
Each repeat: A = TP2 x PP2 (4 ranks) trains 3 iterations, saving at 2 and 3. A copy of A's directory cut back
to iteration 2 is restored at each target layout, which trains iteration 3 and saves it.
Metrics: save ms and bytes written (A's iteration-2 directory), load ms and bytes read (the logging rank), MB/s,
peak memory per rank, the next-step loss error.
Oracle:
  next-step loss  iteration 3's loss at every target layout = A's (1e-5 relative: the same math, resharded)
  checksums       every load verified each shard's xxh3 (the default); the targets' iteration-3 weights,
                  assembled from their shards, equal A's (1e-4 absolute: another summation order) with the same
                  keys and global shapes
  default flags   the TP1 restores logged the adopted padded vocabulary (no --make-vocab-size-divisible-by given)
"""
import os
import shutil

import ckpt
import formulas as F
import runner
from runner import check

ID, TITLE = "E11", "reshard a checkpoint TP2xPP2 -> TP1xPP4 / TP1xPP1"
KEY = ["save_ms", "save_mb", "load_ms_tp1pp4", "next_loss_rel_err_tp1pp4", "next_loss_rel_err_tp1pp1"]


def model(s, extra=()):
    return ["--num-layers", "4", "--hidden-size", str(s["hidden"]), "--num-attention-heads", "4", "--seq-length",
            str(s["seq"]), "--max-position-embeddings", str(s["seq"]), "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "50257", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
            "--lr-warmup-iters", "1", "--train-iters", "3", "--log-interval", "1", "--eval-iters", "0", "--split",
            "100,0,0", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "11", "--save-interval", "2",
            *extra]


TIERS = {
    "cpu": {"hidden": 32, "seq": 16, "targets": [[1, 4, []], [1, 1, []]], "loss_tol": 1e-5, "weight_tol": 1e-4},
    # the save runs on 4 CPU ranks (checkpoints are device-independent), the restore on the one GPU (fp32)
    "gpu": {"hidden": 256, "seq": 256, "targets": [[1, 1, ["--device", "cuda"]]], "loss_tol": 1e-4,
            "weight_tol": 1e-3, "save_device": ["--device", "cpu"]},
}


def broken(s):
    s["corrupt"] = True  # flip one byte of a saved shard: the restore must refuse it (checksums)
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", 50257, tokens=20000)
    ctx.adopted, ctx.restored, ctx.weights_ok = {}, {}, {}


def corrupt(iterdir):
    m = ckpt.manifest(iterdir)
    e = next(e for e in m["tensors"] if e["key"].endswith("linear_fc1.weight"))
    p = os.path.join(iterdir, e["file"])
    with open(p, "r+b") as f:
        f.seek(e["byte_offset"] + 5)
        b = f.read(1)
        f.seek(e["byte_offset"] + 5)
        f.write(bytes([b[0] ^ 0xFF]))


def repeat(ctx, s):
    a = ctx.path("save", "ckpt")
    _, outs, d = ctx.mcpp_run("save-tp2pp2", ["train", *model(s), "--data-path", ctx.data, "--save", a,
                                              "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                                              "2", *s.get("save_device", [])], np_=4)
    ref = {r["iteration"]: r["lm_loss"] for r in runner.records(d, "train")}
    save = [r for r in runner.records(d, "save") if r["iteration"] == 2]
    it2 = ckpt.iter_dir(a, 2)
    out = {"save_ms": save[0]["ms"], "save_mb": ckpt.dir_bytes(it2) / 1e6,
           "peak_mb_save": max(r["memory"]["peak_bytes"] for r in runner.records(d, "train")) / 1e6}
    out["save_mb_s"] = F.throughput_mb_s(ckpt.dir_bytes(it2), out["save_ms"])
    ref_w = ckpt.logical_tensors(ckpt.iter_dir(a, 3), keep=lambda k: not k.startswith("optimizer"))
    for tp, pp, dev in s["targets"]:
        name = f"tp{tp}pp{pp}"
        b = ctx.path(name, "ckpt")
        shutil.copytree(a, b, ignore=shutil.ignore_patterns("iter_0000003", "*.jsonl"))
        with open(os.path.join(b, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write("2")
        if s.get("corrupt"):
            corrupt(ckpt.iter_dir(b, 2))
        rc, outs, d = ctx.mcpp_run(f"restore-{name}", ["train", *model(s, dev), "--data-path", ctx.data, "--load", b,
                                                       "--save", b, "--tensor-model-parallel-size", str(tp),
                                                       "--pipeline-model-parallel-size", str(pp)],
                                   np_=tp * pp, expect_ok=False)
        text = "\n".join(outs.values())
        ctx.restored.setdefault(name, []).append(rc == 0)
        ctx.adopted.setdefault(name, []).append("using padded_vocab_size 50432" in text)
        if rc != 0:
            ctx.failure = text[-600:]
            continue
        got = {r["iteration"]: r["lm_loss"] for r in runner.records(d, "train")}
        out[f"next_loss_rel_err_{name}"] = F.rel_err(got.get(3, float("inf")), ref[3])
        line = next(l for l in text.splitlines() if "loaded checkpoint from" in l)
        ms, nbytes = float(line.split(" in ")[1].split()[0]), int(line.split("(")[1].split()[0])
        out[f"load_ms_{name}"], out[f"load_mb_{name}"] = ms, nbytes / 1e6
        out[f"load_mb_s_{name}"] = F.throughput_mb_s(nbytes, ms)
        out[f"peak_mb_{name}"] = max(r["memory"]["peak_bytes"] for r in runner.records(d, "train")) / 1e6
        if tp == 1:
            ctx.tp1_ckpt = b
        w = ckpt.logical_tensors(ckpt.iter_dir(b, 3), keep=lambda k: not k.startswith("optimizer"))
        same_keys = sorted((k, v[0]) for k, v in w.items()) == sorted((k, v[0]) for k, v in ref_w.items())
        err = max(ckpt.max_abs_diff(w[k][1], ref_w[k][1]) for k in ref_w if k in w)
        out[f"weight_max_abs_err_{name}"] = err
        ctx.weights_ok.setdefault(name, []).append(same_keys)
    return out


def oracle(ctx, s, repeats):
    res = []
    for tp, pp, _ in s["targets"]:
        n = f"tp{tp}pp{pp}"
        ok = all(ctx.restored.get(n, [False]))
        res.append(check(f"{n}: restore loads (every shard's xxh3 verified)", ok,
                         "" if ok else getattr(ctx, "failure", "")))
        if not ok:
            continue
        res.append(check(f"{n}: next-step loss = TP2xPP2's ({s['loss_tol']:g} rel)", all(
            r[f"next_loss_rel_err_{n}"] <= s["loss_tol"] for r in repeats),
            f"max {max(r[f'next_loss_rel_err_{n}'] for r in repeats):.3g}"))
        res.append(check(f"{n}: iteration-3 weights = TP2xPP2's ({s['weight_tol']:g} abs), same keys and shapes",
                         all(ctx.weights_ok[n]) and all(r[f"weight_max_abs_err_{n}"] <= s["weight_tol"]
                                                        for r in repeats),
                         f"max {max(r[f'weight_max_abs_err_{n}'] for r in repeats):.3g}"))
        res.append(check(f"{n}: default flags: the saved padded vocabulary 50432 adopted and logged",
                         all(ctx.adopted[n]), f"{ctx.adopted[n]}"))
    if getattr(ctx, "tp1_ckpt", None) and s.get("tp2_refusal", True):
        # the other direction: a TP1 checkpoint (50432 now, adopted) is fine at TP2 (a multiple of 256); one padded
        # to 50304 is not: the refusal must name the flag value that works. Build it by a TP1 save from scratch.
        c = ctx.path("tp1-fresh", "ckpt")
        ctx.mcpp_run("tp1-fresh", ["train", *model(s, s.get("save_device", [])), "--data-path", ctx.data, "--save", c,
                                   "--train-iters", "2"])
        rc, outs, _ = ctx.mcpp_run("tp2-from-50304", ["train", *model(s, s.get("save_device", [])), "--data-path",
                                                      ctx.data, "--load", c, "--tensor-model-parallel-size", "2"],
                                   np_=2, expect_ok=False)
        # the first rank to fail prints the error (the others may be stopped first): every rank's output counts
        errs = [l for l in ("\n".join(outs.values()) + ctx.last_stderr).splitlines() if l.startswith("error:")]
        ok = rc != 0 and errs and "--make-vocab-size-divisible-by 64 pads to 50304" in errs[0]
        res.append(check("TP1 checkpoint (50304) at TP2 with default flags: one error naming the flag value", ok,
                         errs[0] if errs else f"exit {rc}, no error line"))
    return res


def negative(ctx, s):
    names = [f"tp{tp}pp{pp}" for tp, pp, _ in s["targets"]]
    if len(names) < 2 or not all(f"load_ms_{n}" in ctx.repeats[0] for n in names):
        return "Only one restore layout in this tier: no comparison.\n"
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    many, one = med(f"load_ms_{names[0]}"), med(f"load_ms_{names[1]}")
    verdict = "does not help" if many > 0.97 * one else "helps"
    return (f"Restoring on 4 ranks (TP1 x PP4) instead of 1: spreading the read {verdict} the load time here "
            f"({many:.1f} ms on the last rank vs {one:.1f} ms, medians; the last rank reads "
            f"{med(f'load_mb_{names[0]}'):.2f} MB vs {med(f'load_mb_{names[1]}'):.2f} MB).\n\n"
            f"Reason: the checkpoint is {med('save_mb'):.1f} MB, so the load is the manifest parse, the checksum "
            f"pass and the file opens, which every rank pays; the tied embedding ([50432, h], most of the bytes) is "
            f"read by both the first and the last stage.\n")


def report(s, summary, checks):
    st = summary["stats"]
    rows = ["| metric | median | min | max |", "|---|---:|---:|---:|"]
    for k in sorted(st):
        rows.append(f"| {k} | {st[k]['median']:.4g} | {st[k]['min']:.4g} | {st[k]['max']:.4g} |")
    return "## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\n## IO, memory, errors\n\n" + \
        "\n".join(rows) + "\n"
