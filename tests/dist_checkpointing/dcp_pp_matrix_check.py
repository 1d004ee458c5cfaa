#!/usr/bin/env python3
"""Pipeline / virtual-stage reshard matrix, `mcpp ckpt convert` and `mcpp ckpt info` (issue 5, E11).

usage: dcp_pp_matrix_check.py MCPP WORKDIR
  Sources (iteration 3 of 6, SwiGLU, dropout 0):
    pp4v2          PP4 with 2 virtual stages per rank (4 ranks)
    tp2pp2         TP2 x PP2 (4 ranks)
    tp2pp2dp2_dopt TP2 x PP2 x DP2 + distributed optimizer (8 ranks)
  (8 layers each.) Targets: pp4v2 -> PP2 V1, PP1, PP4 V1; tp2pp2 / tp2pp2dp2_dopt -> TP1 x PP4,
  TP4 x PP1, TP1 x PP1, PP4 V2 (distributed optimizer off everywhere; virtual stages need pp > 2, as in
  Megatron, so PP4 V2 stands for "PP2 with virtual stages"). For each:
  1. load and re-save at once: every logical tensor (model, exp_avg, exp_avg_sq) assembled by the
     independent oracle dcp_oracle.py is bit-identical to the source's;
  2. load and train to 6: losses of iterations 4..6 equal the uninterrupted source run (1e-6 relative).
  convert: tp2pp2 -> (TP1, PP1), (TP4, PP1) and (PP4, V2), and tp2pp2dp2_dopt -> TP1 (distributed-optimizer
  pieces become plain Adam state) offline: oracle-identical logical tensors, `ckpt verify`
  passes, and resuming from the converted checkpoint gives exactly the losses of resuming from the
  original at the same layout; bad arguments (tp not dividing the heads, a missing dir) exit 2 with the
  reason. info: one line per distinct logical key with dtype, global shape, shard count and bytes that
  agree with the manifest, plus the layout and totals.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle", "cli"))
from cli_harness import MCPP, WORK, failures, losses, record_corpus, run  # noqa: E402  argv, fresh work dir, run()
from dcp_oracle import assemble  # noqa: E402


record_corpus()


def model(layers):
    return ["--num-layers", str(layers), "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
            "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--lr-decay-iters", "6", "--log-interval", "1",
            "--eval-interval", "100", "--eval-iters", "1", "--split", "90,10,0", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--swiglu", "--data-path", os.path.join(WORK, "c_text_document"),
            "--seed", "5"]


def layout(tp, pp, vstage=0, extra=()):
    f = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
         "--make-vocab-size-divisible-by", str(128 // tp), *extra]
    return f + (["--num-layers-per-virtual-pipeline-stage", str(vstage)] if vstage else [])


def compare(name, ref, path):
    try:
        got, man = assemble(path)
        bad = [k for k in ref if k not in got or got[k].shape != ref[k].shape or got[k].tobytes() != ref[k].tobytes()]
        if bad or set(got) != set(ref):
            failures.append(f"{name}: logical tensors differ: {bad[:5]} (of {len(ref)}); extra {set(got) - set(ref)}")
        return man
    except (AssertionError, OSError, KeyError) as e:
        failures.append(f"{name}: checkpoint unreadable by the oracle: {e!r}")
        return None


SOURCES = {
    "pp4v2": (8, 4, layout(1, 4, 1)),
    "tp2pp2": (8, 4, layout(2, 2)),
    "tp2pp2dp2_dopt": (8, 8, layout(2, 2, 0, ["--use-distributed-optimizer", "--ddp-bucket-size", "3000"])),
}
TARGETS = {
    "pp4v2": {"pp2v1": (2, layout(1, 2)), "pp1": (1, layout(1, 1)), "pp4v1": (4, layout(1, 4))},
    "tp2pp2": {"tp1pp4": (4, layout(1, 4)), "tp4pp1": (4, layout(4, 1)), "tp1pp1": (1, layout(1, 1)),
               "pp4v2": (4, layout(1, 4, 1))},
}
TARGETS["tp2pp2dp2_dopt"] = TARGETS["tp2pp2"]
refs = {}
for src, (layers, np_, flags) in SOURCES.items():
    M = model(layers)
    full = os.path.join(WORK, f"{src}_full")
    run([MCPP, "train", *M, *flags, "--train-iters", "6", "--save", full], np_)
    part = os.path.join(WORK, f"{src}_src")
    run([MCPP, "train", *M, *flags, "--train-iters", "6", "--exit-interval", "3", "--save", part], np_)
    it3 = os.path.join(part, "iter_0000003")
    try:
        ref, ref_man = assemble(it3)
    except (AssertionError, OSError, KeyError) as e:
        failures.append(f"{src}: source unreadable: {e!r}")
        continue
    refs[src] = (ref, part)
    if len(ref) != 3 * len([k for k in ref if not k.startswith("optimizer.")]):
        failures.append(f"{src}: not every model tensor has both Adam moments")
    ref_loss = losses(full)
    for name, (tnp, tflags) in TARGETS[src].items():
        resaved = os.path.join(WORK, f"{src}_resave_{name}")
        run([MCPP, "train", *M, *tflags, "--train-iters", "3", "--load", part, "--save", resaved], tnp)
        compare(f"{src} -> {name}", ref, os.path.join(resaved, "iter_0000003"))
        cont = os.path.join(WORK, f"{src}_cont_{name}")
        shutil.copytree(part, cont, ignore=shutil.ignore_patterns("metrics.jsonl"))
        run([MCPP, "train", *M, *tflags, "--train-iters", "6", "--load", cont, "--save", cont], tnp)
        got = losses(cont)
        for i in (4, 5, 6):  # fp32, different reduction orders across layouts: 1e-6 relative
            if i not in got or abs(got[i] - ref_loss.get(i, 0)) > 1e-6 * abs(ref_loss.get(i, 1)):
                failures.append(f"{src} -> {name}: loss at {i}: {got.get(i)} vs uninterrupted {ref_loss.get(i)}")
        print(f"{src} -> {name}: np {tnp}, losses {[got.get(i) for i in (4, 5, 6)]} vs {[ref_loss.get(i) for i in (4, 5, 6)]}")

# convert (offline) from TP2 x PP2
if "tp2pp2" in refs:
    ref, part = refs["tp2pp2"]
    M = model(8)
    for name, tp, pp, vp, tflags in (("tp1pp1", 1, 1, 1, layout(1, 1)), ("tp4pp1", 4, 1, 1, layout(4, 1)),
                                     ("pp4v2", 1, 4, 2, layout(1, 4, 1))):
        out = os.path.join(WORK, f"convert_{name}")
        run([MCPP, "ckpt", "convert", part, "--tp", str(tp), "--pp", str(pp), "--vp", str(vp), "--output", out])
        man = compare(f"convert -> {name}", ref, os.path.join(out, "iter_0000003"))
        world = tp * pp
        if man is not None and (man["meta"]["parallel"]["tp"] != tp or man["meta"]["parallel"]["pp"] != pp or
                                man["meta"]["parallel"]["vp"] != vp or man["meta"]["parallel"]["world_size"] != world or
                                man["meta"]["config"]["parallel"]["tensor_model_parallel_size"] != tp):
            failures.append(f"convert -> {name}: meta.parallel {man['meta']['parallel']}")
        if man is not None and len({e["file"] for e in man["tensors"]}) != (2 if world == 1 else 2 * world):
            failures.append(f"convert -> {name}: files {sorted({e['file'] for e in man['tensors']})}")
        run([MCPP, "ckpt", "verify", out])
        run([MCPP, "train", *M, *tflags, "--train-iters", "6", "--load", out, "--save", out], world)
        want = losses(os.path.join(WORK, f"tp2pp2_cont_{name}"))
        got = losses(out)
        if not got or [got.get(i) for i in (4, 5, 6)] != [want.get(i) for i in (4, 5, 6)]:
            failures.append(f"convert -> {name}: resumed losses {got} vs resumed from the original {want}")
        print(f"convert -> {name}: resumed losses {[got.get(i) for i in (4, 5, 6)]}")
    if "tp2pp2dp2_dopt" in refs:  # distributed-optimizer pieces -> plain Adam state, logically identical
        dref, dpart = refs["tp2pp2dp2_dopt"]
        out = os.path.join(WORK, "convert_dopt_tp1pp1")
        run([MCPP, "ckpt", "convert", dpart, "--tp", "1", "--pp", "1", "--output", out])
        man = compare("convert distopt -> tp1pp1", dref, os.path.join(out, "iter_0000003"))
        if man is not None and (man["meta"]["optimizer"] != {"step": 3} or man["meta"]["parallel"]["distributed_optimizer"]):
            failures.append(f"convert distopt: meta.optimizer {man['meta']['optimizer']}, parallel {man['meta']['parallel']}")
    for args, want in ((["--tp", "3", "--pp", "1"], "num_attention_heads"),
                       (["--tp", "1", "--pp", "3"], "num_layers"),
                       (["--tp", "1", "--pp", "2", "--vp", "3"], "num_layers")):
        p = run([MCPP, "ckpt", "convert", part, *args, "--output", os.path.join(WORK, "bad")], expect=None)
        if p.returncode != 2 or want not in p.stderr or "error:" not in p.stderr:
            failures.append(f"convert {args}: exit {p.returncode}, stderr {p.stderr[-500:]!r} (want exit 2 naming {want})")
    p = run([MCPP, "ckpt", "convert", os.path.join(WORK, "missing"), "--tp", "1", "--pp", "1", "--output",
             os.path.join(WORK, "bad")], expect=None)
    if p.returncode != 2 or "missing" not in p.stderr:
        failures.append(f"convert of a missing dir: exit {p.returncode}, {p.stderr[-500:]!r}")

    # info: one line per distinct key
    p = run([MCPP, "ckpt", "info", part])
    man = json.load(open(os.path.join(part, "iter_0000003", "manifest.json")))
    per_key = {}
    for e in man["tensors"]:
        k = per_key.setdefault(e["key"], [e["dtype"], e["global_shape"], 0, 0])
        k[2] += 1
        k[3] += e["byte_length"]
    lines = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines() if ln.split() and ln.split()[0] in per_key}
    if set(lines) != set(per_key):
        failures.append(f"info: keys listed {len(lines)} vs manifest {len(per_key)}")
    for k, (dt, shape, n, b) in per_key.items():
        ln = lines.get(k)
        if not ln or ln[1] != dt or int(ln[-2]) != n or int(ln[-1]) != b:
            failures.append(f"info line for {k}: {ln} vs dtype {dt} shards {n} bytes {b}")
    if "tp=2 pp=2" not in p.stdout or f"{len(per_key)} logical tensors, {len(man['tensors'])} shards" not in p.stdout:
        failures.append(f"info: layout/totals missing:\n{p.stdout[:800]}")

if failures:
    print("FAIL\n" + "\n".join(failures))
    sys.exit(1)
print("OK: PP4 V2, TP2 x PP2, TP2 x PP2 x DP2 + distopt reshard to every target bit-identically with equal "
      "losses; convert and info agree with the oracle")
