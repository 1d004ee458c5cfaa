"""E01: the module trace of one GPT step (`mcpp train --trace-modules N`, docs/OBSERVABILITY.md).

Oracle: the forward tree is GPTModel > embedding, decoder > layers.<i> > self_attention > linear_qkv,
core_attention, linear_proj | mlp > linear_fc1, linear_fc2; output_layer; loss (Megatron-Core's module
names), each module's output shape follows from the config ([s, b, h], qkv [s, b, 3h], fc1 [s, b, ffn = 4h],
logits [s, b, V padded to 128]), the backward visits the leaves in exactly the reverse order, every linear
launches one GEMM op forward, and the trace is identical across repeats.
"""
import json

import runner
from runner import check

ID, TITLE = "E01", "module trace of one GPT step"
KEY = ["step_ms", "modules", "fwd_op_calls", "bwd_op_calls"]


def model(s, iters=2):
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads",
            str(s["heads"]), "--seq-length", str(s["seq"]), "--max-position-embeddings", str(s["seq"]),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(s["vocab"]), "--micro-batch-size",
            str(s["mbs"]), "--global-batch-size", str(s["mbs"]), "--lr", "1e-3", "--train-iters", str(iters),
            "--log-interval", str(max(1, iters // 2)), "--eval-iters", "0", "--split", "100,0,0",
            "--hidden-dropout", "0", "--attention-dropout", "0", *s.get("device", []), *s.get("extra", [])]


TIERS = {
    "cpu": {"layers": 2, "hidden": 32, "heads": 4, "seq": 16, "vocab": 256, "mbs": 2},
    "gpu": {"layers": 2, "hidden": 768, "heads": 12, "seq": 1024, "vocab": 50257, "mbs": 4,
            "device": ["--device", "cuda", "--bf16"]},
}


def broken(s):
    # a model whose FFN is not 4h: the oracle's shape formula must catch it
    s["extra"] = ["--ffn-hidden-size", str(3 * s["hidden"])]
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", min(s["vocab"], 50257), tokens=s["seq"] * s["mbs"] * 40)


def trace(ctx, s, name, extra=()):
    _, outs, d = ctx.mcpp_run(name, ["train", *model(s), "--data-path", ctx.data, "--trace-modules", "2", *extra])
    tr = runner.records(d, "module_trace", rank=0)
    steps = [r for r in runner.records(d, "train", rank=0)]
    return (tr[0] if tr else None), steps


def walk(n, out, depth=0):
    out.append((depth, n))
    for c in n["children"]:
        walk(c, out, depth + 1)
    return out


def repeat(ctx, s):
    tr, steps = trace(ctx, s, "trace")
    if tr is None:
        raise runner.RunFailed("no module_trace record in rank 0's metrics")
    ctx.traces = getattr(ctx, "traces", []) + [tr]
    fwd, bwd = walk(tr["forward"], []), walk(tr["backward"], [])
    return {"step_ms": steps[-1]["step_ms_mean"], "modules": len(fwd),
            "fwd_op_calls": sum(o["calls"] for _, n in fwd for o in n["ops"]),
            "bwd_op_calls": sum(o["calls"] for _, n in bwd for o in n["ops"]),
            "peak_bytes": steps[-1]["memory"]["peak_bytes"]}


def leaves(tree):
    return [n["name"] for _, n in walk(tree, []) if not n["children"]]


def oracle(ctx, s, repeats):
    tr = ctx.traces[0]
    sq, b, h, L = s["seq"], s["mbs"], s["hidden"], s["layers"]
    vpad = -(-s["vocab"] // 128) * 128
    dt = "bfloat16" if "--bf16" in s.get("device", []) else "float32"
    want = {"embedding": [sq, b, h], "output_layer": [sq, b, vpad]}
    order = ["embedding"]
    for i in range(L):
        p = f"decoder.layers.{i}"
        want.update({p + ".self_attention.linear_qkv": [sq, b, 3 * h], p + ".self_attention.linear_proj": [sq, b, h],
                     p + ".mlp.linear_fc1": [sq, b, 4 * h], p + ".mlp.linear_fc2": [sq, b, h]})
        order += [p + ".self_attention.linear_qkv", "core_attention", p + ".self_attention.linear_proj",
                  p + ".mlp.linear_fc1", p + ".mlp.linear_fc2"]
    order += ["output_layer", "loss"]
    fwd = walk(tr["forward"], [])
    got = {n["name"]: n["outputs"][0] for _, n in fwd if n["name"] in want}
    bad = {k: (got.get(k), f"[{', '.join(map(str, v))}]") for k, v in want.items()
           if not (got.get(k) or "").endswith(f"[{', '.join(map(str, v))}]")}
    f_leaves, b_leaves = leaves(tr["forward"]), leaves(tr["backward"])
    linears = [n for _, n in fwd if n["name"].rsplit(".", 1)[-1].startswith("linear") or n["name"] == "output_layer"]
    one_gemm = all(sum(o["calls"] for o in n["ops"] if o["op"].startswith("linear")) == 1 for n in linears)
    same = all(json.dumps(t["forward"], sort_keys=True) == json.dumps(tr["forward"], sort_keys=True)
               for t in ctx.traces)
    return [
        check("module order (Megatron-Core names)", f_leaves == order, f"{f_leaves}" if f_leaves != order else
              f"{len(order)} leaves"),
        check("output shapes from the config", not bad, f"mismatches (got, want): {bad}" if bad else
              f"{len(want)} modules, dtype {dt}, padded vocab {vpad}"),
        check("backward = forward reversed", b_leaves == list(reversed(f_leaves)) or
              b_leaves == list(reversed(f_leaves))[:len(b_leaves)] and len(b_leaves) >= len(f_leaves) - 1,
              f"{len(b_leaves)} backward leaves"),
        check("one GEMM per linear forward", one_gemm, f"{len(linears)} linears"),
        check("trace identical over repeats", same, f"{len(ctx.traces)} traces"),
    ]


def negative(ctx, s):
    # CPU: the blocked (flash) attention vs the unfused one; GPU (where attention is cuDNN's or our fused kernel and
    # `unfused` does not run): the whole step captured in a CUDA graph vs eager launches
    gpu = "--device" in s.get("device", [])
    a, b = (("graph", ["--enable-cuda-graph"]), ("eager", [])) if gpu else \
        (("flash", ["--attention-impl", "flash"]), ("unfused", ["--attention-impl", "unfused"]))
    t = {}
    for name, flags in (a, b):
        ms = []
        for k in range(3):  # not traced (--trace-modules refuses CUDA graphs); the second log window is timed
            _, _, d = ctx.mcpp_run(f"neg-{name}-{k}", ["train", *model(s, iters=20), "--data-path", ctx.data, *flags])
            ms.append(runner.records(d, "train", rank=0)[-1]["step_ms_mean"])
        t[name] = runner.formulas.median(ms)
    ratio = t[a[0]] / t[b[0]]
    verdict = "does not help" if ratio > 0.97 else "helps"
    what = "`--enable-cuda-graph` vs eager" if gpu else "`--attention-impl flash` vs `unfused`"
    reason = ("a step of this size is GEMM-bound: its ~100 kernel launches cost little next to the GEMMs, so "
              "replaying them as one graph saves only the host's launch time" if gpu else
              "at this sequence length the attention is a small share of the step; the blocked (flash) kernel "
              "saves the [s, s] score memory, which only pays off when s^2 grows")
    return (f"{what} at s={s['seq']}: {a[0]} {verdict} here (step {t[a[0]]:.3f} ms vs {t[b[0]]:.3f} ms, ratio "
            f"{ratio:.3f}; median of 3).\n\nReason (when it does not help): {reason}.\n")


def report(s, summary, checks):
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\n## Metrics\n\n" +
            runner.stats_table(summary, KEY + ["peak_bytes"]))
