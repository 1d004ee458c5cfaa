"""E04: sequence length x {TP2, TP2 + SP, full recompute, selective recompute}: which activations each saves.

Per sequence length (cpu: 32 / 64 / 128) each repeat trains 2 steps in four modes with the unfused attention
(its [b, np, s, s] scores are the s^2 term selective recompute targets): TP2 (no SP), TP2 + SP, TP2 + SP + full
recompute (uniform, 1 layer per group), TP2 + SP + selective recompute (core_attn), --timeline.
Metrics: activation bytes per microbatch and peak (the trainer's activation report), SP all-gather /
reduce-scatter calls per step, step time; recompute FLOPs from Megatron's hardware-FLOPs count (full: one more
forward of every layer, 96/72 of the model FLOPs without the logits; selective: the core attention forwards).
Oracle:
  measured = planned     per-microbatch and peak activation bytes equal the memory planner's (exact), every cell
  SP                     saves activations at every s (the [s, b, h] tensors split over t)
  recompute              full < selective < no recompute at every s; the selective saving (share of the
                         activations) grows with s (it removes the s^2 term, Korthikanti et al. 2022)
  SP collectives         per step M (4L + 2) all-gathers and M (4L + 1) reduce-scatters (bench/comm_bytes.py)
"""
import json

import formulas as F
import runner
from runner import check

ID, TITLE = "E04", "activation memory: SP vs full vs selective recompute"
KEY = ["ctx_kb_s128_tp2", "ctx_kb_s128_sp", "ctx_kb_s128_full", "ctx_kb_s128_selective"]
MODES = {"tp2": [], "sp": ["--sequence-parallel"],
         "full": ["--sequence-parallel", "--recompute-granularity", "full", "--recompute-method", "uniform",
                  "--recompute-num-layers", "1"],
         "selective": ["--sequence-parallel", "--recompute-granularity", "selective"]}


def model(s, seq):
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads", "4",
            "--seq-length", str(seq), "--max-position-embeddings", str(seq), "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "256", "--make-vocab-size-divisible-by", "64", "--micro-batch-size", "2",
            "--global-batch-size", str(2 * s["m"]), "--lr", "1e-3", "--train-iters", "2", "--log-interval", "1",
            "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0", "--attention-dropout", "0",
            "--tensor-model-parallel-size", "2", "--attention-impl", "unfused"]


TIERS = {"cpu": {"seqs": [32, 64, 128], "layers": 2, "hidden": 32, "m": 1},
         "gpu": "TP2 + SP needs 2 GPUs: run on nvidia-h100-x2"}


def broken(s):
    s["seqs"] = list(reversed(s["seqs"]))  # the oracle reads the list as increasing s
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", 256, tokens=40000)
    ctx.planned = []


def repeat(ctx, s):
    out = {}
    for seq in s["seqs"]:
        for mode, flags in MODES.items():
            trace = ctx.path(f"s{seq}-{mode}", "trace.json")
            _, _, d = ctx.mcpp_run(f"s{seq}-{mode}", ["train", *model(s, seq), *flags, "--data-path", ctx.data,
                                                       "--timeline", trace], np_=2)
            st = runner.records(d, "pipeline_activation_memory")[-1]["stages"][0]
            ctx.planned.append((seq, mode, st["context_bytes"] == st["planned_context_bytes"]
                                and st["peak_bytes"] == st["planned_peak_bytes"]))
            out[f"ctx_kb_s{seq}_{mode}"] = st["context_bytes"] / 1024
            out[f"step_ms_s{seq}_{mode}"] = runner.records(d, "train")[-1]["elapsed_ms_per_iter"]
            ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("cat") == "collective" and e["pid"] == 0
                  and e["args"].get("step") == 1 and e["args"].get("group") == "tp"]
            out[f"ag_calls_s{seq}_{mode}"] = sum(e["name"].startswith("all_gather") for e in ev)
            out[f"rs_calls_s{seq}_{mode}"] = sum(e["name"].startswith("reduce_scatter") for e in ev)
    return out


def recompute_flops(s, seq, mode):
    """Extra forward FLOPs of recompute per step (Megatron's hardware count minus the model count)."""
    b, L, h = 2 * s["m"], s["layers"], s["hidden"]
    if mode == "full":  # one more forward of every layer: 24 B s L h^2 (1 + s/(12h)) (a third of 72's fwd+bwd)
        return 24.0 * b * seq * L * h * h * (1 + seq / (12.0 * h))
    if mode == "selective":  # the core attention forward: QK^T and AV, causal half: 2 * 2 B s^2 h / 2 per layer
        return 2.0 * b * seq * seq * h * L
    return 0.0


def oracle(ctx, s, repeats):
    med = lambda k: F.median([r[k] for r in repeats])
    res = [check("activations measured = planned (per microbatch and peak), every cell", all(p for *_, p in ctx.planned),
                 f"{sum(p for *_, p in ctx.planned)}/{len(ctx.planned)} cells")]
    seqs = s["seqs"]
    res.append(check("SP saves activations at every s", all(med(f"ctx_kb_s{q}_sp") < med(f"ctx_kb_s{q}_tp2")
                                                            for q in seqs),
                     ", ".join(f"s{q}: {med(f'ctx_kb_s{q}_sp'):.0f} < {med(f'ctx_kb_s{q}_tp2'):.0f} KiB" for q in seqs)))
    res.append(check("full < selective < no recompute at every s", all(
        med(f"ctx_kb_s{q}_full") < med(f"ctx_kb_s{q}_selective") < med(f"ctx_kb_s{q}_sp") for q in seqs)))
    share = [1 - med(f"ctx_kb_s{q}_selective") / med(f"ctx_kb_s{q}_sp") for q in seqs]
    res.append(check("selective recompute's saving grows with s (the s^2 term)",
                     all(a < b for a, b in zip(share, share[1:])), " < ".join(f"{x:.3f}" for x in share)))
    L, M = s["layers"], s["m"]
    ok = all(repeats[0][f"ag_calls_s{q}_{m}"] == M * (4 * L + 2) and repeats[0][f"rs_calls_s{q}_{m}"] == M * (4 * L + 1)
             for q in seqs for m in ("sp", "selective"))
    res.append(check("SP: M(4L+2) all-gathers, M(4L+1) reduce-scatters per step", ok,
                     f"s{seqs[0]} sp: AG {repeats[0][f'ag_calls_s{seqs[0]}_sp']}, RS {repeats[0][f'rs_calls_s{seqs[0]}_sp']}"))
    return res


def negative(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    q = max(s["seqs"])
    a, b = med(f"step_ms_s{q}_full"), med(f"step_ms_s{q}_sp")
    return (f"Full recompute at s={q} when the activations already fit: it does not help the step "
            f"({a:.1f} ms vs {b:.1f} ms without; it saves {med(f'ctx_kb_s{q}_sp') - med(f'ctx_kb_s{q}_full'):.0f} KiB "
            f"per microbatch that no one needed).\n\nReason: it re-runs every layer's forward "
            f"({recompute_flops(s, q, 'full') / 1e6:.1f} MFLOP more per step): memory is traded for time, a win only "
            f"when the saved bytes let a larger micro-batch or model fit.\n")


def report(s, summary, checks):
    st = summary["stats"]
    rows = ["| s | mode | activations / microbatch KiB | step ms | SP AG / RS per step | recompute MFLOP / step |",
            "|---:|---|---:|---:|---|---:|"]
    for q in s["seqs"]:
        for m in MODES:
            g = lambda k: st[f"{k}_s{q}_{m}"]["median"]
            rows.append(f"| {q} | {m} | {g('ctx_kb'):.1f} | {g('step_ms'):.1f} | {g('ag_calls'):.0f} / "
                        f"{g('rs_calls'):.0f} | {recompute_flops(s, q, m) / 1e6:.2f} |")
    return "## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\n## Activations\n\n" + "\n".join(rows) + "\n"
