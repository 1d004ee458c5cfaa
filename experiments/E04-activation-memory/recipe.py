"""E04: which activations sequence parallelism and (full, selective) recompute save, and at what cost.

Form "tp2" (cpu tier on 2 CPU ranks; gpu-multi on 2 GPUs): sequence length x {TP2, TP2 + SP, full recompute,
selective recompute}. Per sequence length (cpu: 32 / 64 / 128) each repeat trains 2 steps in four modes: TP2 (no SP),
TP2 + SP, TP2 + SP + full recompute (uniform, 1 layer per group), TP2 + SP + selective recompute (core_attn),
--timeline. The cpu tier uses the unfused attention (its [b, np, s, s] scores are the s^2 term selective recompute
targets); on GPUs attention is fused (cuDNN / flash: no s^2 tensor is kept).
Metrics: activation bytes per microbatch and peak (the trainer's activation report), SP all-gather /
reduce-scatter calls per step, step time; recompute FLOPs from Megatron's hardware-FLOPs count (full: one more
forward of every layer, 96/72 of the model FLOPs without the logits; selective: the core attention forwards).
Oracle:
  measured = planned     per-microbatch and peak activation bytes equal the memory planner's (exact), every cell
  SP                     saves activations at every s (the [s, b, h] tensors split over t)
  recompute              full < selective < no recompute at every s; unfused attention: the selective saving (share
                         of the activations) grows with s (it removes the s^2 term, Korthikanti et al. 2022); fused
                         attention: selective saves exactly the softmax statistics, L b (np/t) s 4 bytes
  SP collectives         per step M (4L + 2) all-gathers and M (4L + 1) reduce-scatters (bench/comm_bytes.py)

Form "tp1" (gpu tier, one GPU; GPT-2 124M shapes, bf16, cuDNN attention, micro batch 2): s = 512 / 2048 / 4096 x
{no recompute, selective (core_attn), full (uniform, 1 layer per group)}. No SP: at TP1 there is no tensor-parallel
group to split the sequence over (SP is the gpu-multi form's). Per cell: the trainer's measured contexts and the
device's peak (CUDA pool high-water mark), and `mcpp plan memory --json` for the same flags (params, grads, main
params, optimizer state, activations).
Oracle:
  measured = planned     contexts per microbatch and their peak = the trainer's plan and `mcpp plan memory`'s (exact);
                         model state = planned (exact)
  recompute              activations full < selective < none at every s; selective = none - L b np s 4 (cuDNN
                         attention keeps no s^2 scores, so core_attn recompute only drops the softmax statistics)
  device peak            plan <= peak <= plan + 2 x one layer's contexts + 512 MiB (the planner leaves out a backward
                         step's transients: one recomputed / back-propagated layer's tensors and their gradients, and
                         the GEMM / attention workspaces), and full < none
Recompute FLOPs (formulas.recompute_flops) and the hardware TFLOP/s they run at are reported per cell.
"""
import json

import formulas as F
import runner
from runner import check

ID, TITLE = "E04", "activation memory: SP vs full vs selective recompute"
KEY = ["ctx_kb_s128_tp2", "ctx_kb_s128_sp", "ctx_kb_s128_full", "ctx_kb_s128_selective",
       "ctx_mib_s4096_none", "ctx_mib_s4096_selective", "ctx_mib_s4096_full", "peak_mib_s4096_none",
       "peak_mib_s4096_full"]
FULL = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
SELECTIVE = ["--recompute-granularity", "selective"]
MODES = {"tp2": [], "sp": ["--sequence-parallel"], "full": ["--sequence-parallel", *FULL],
         "selective": ["--sequence-parallel", *SELECTIVE]}
MODES_TP1 = {"none": [], "selective": SELECTIVE, "full": FULL}


def model(s, seq):
    tp = s.get("tp", 2)
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads",
            str(s.get("heads", 4)), "--seq-length", str(seq), "--max-position-embeddings", str(seq),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(s.get("vocab", 256)),
            "--make-vocab-size-divisible-by", "64", "--micro-batch-size", str(s.get("mbs", 2)),
            "--global-batch-size", str(s.get("mbs", 2) * s.get("m", 1)), "--lr", "1e-3", "--train-iters",
            str(s.get("iters", 2)), "--log-interval", "1", "--eval-iters", "0", "--split", "100,0,0",
            "--hidden-dropout", "0", "--attention-dropout", "0", *(["--tensor-model-parallel-size", str(tp)]
                                                                    if tp > 1 else []),
            *(["--attention-impl", s.get("attn", "unfused")] if s.get("attn", "unfused") != "flash" else []),
            *s.get("device", [])]


TIERS = {"cpu": {"seqs": [32, 64, 128], "layers": 2, "hidden": 32, "m": 1},
         "gpu": {"form": "tp1", "tp": 1, "seqs": [512, 2048, 4096], "layers": 12, "hidden": 768, "heads": 12,
                 "vocab": 50304, "mbs": 2, "iters": 3, "attn": "flash", "device": ["--device", "cuda", "--bf16"],
                 "workspace_mib": 512},
         "gpu-multi": {"seqs": [512, 2048, 4096], "layers": 12, "hidden": 768, "heads": 12, "vocab": 50304, "m": 1,
                       "attn": "flash", "plan_cli": True, "device": ["--device", "cuda", "--bf16"], "gpus": 2,
                       "why_gpus": "TP2 + SP puts one rank on each of 2 GPUs: run on nvidia-h100-x2 (one GPU: "
                                   "--tier gpu, recompute at TP1)"}}
# --smoke: the gpu tiers' code on CPU ranks (fp32, small shapes)
SMOKE = {"gpu": {"seqs": [64, 128, 256], "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "device": []},
         "gpu-multi": {"seqs": [32, 64, 128], "layers": 2, "hidden": 32, "heads": 4, "vocab": 256, "device": []}}


def broken(s):
    if s.get("attn", "unfused") == "unfused":
        s["seqs"] = list(reversed(s["seqs"]))  # the oracle reads the list as increasing s
    else:
        s["plan_without_recompute"] = True  # the planner asked about other flags than the run's: it must disagree
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", s.get("vocab", 256),
                                 tokens=max(40000, s.get("mbs", 2) * s.get("m", 1) * (max(s["seqs"]) + 1) *
                                            (s.get("iters", 2) + 1)))
    ctx.planned, ctx.plan_cli = [], []


def plan(ctx, s, name, seq, flags, world):
    """`mcpp plan memory --json` for the run's flags (broken input: without its recompute flags)."""
    if s.get("plan_without_recompute"):
        flags = [f for f in flags if f not in FULL + SELECTIVE]
    _, outs, _ = ctx.mcpp_run(name + "-plan", ["plan", "memory", "--world", str(world), "--json", *model(s, seq),
                                               *flags], metrics=False)
    return json.loads(outs[0])["stages"][0]


def repeat(ctx, s):
    return repeat_tp1(ctx, s) if s.get("form") == "tp1" else repeat_tp2(ctx, s)


def oracle(ctx, s, repeats):
    return oracle_tp1(ctx, s, repeats) if s.get("form") == "tp1" else oracle_tp2(ctx, s, repeats)


def negative(ctx, s):
    return negative_tp1(ctx, s) if s.get("form") == "tp1" else negative_tp2(ctx, s)


def report(s, summary, checks):
    return report_tp1(s, summary) if s.get("form") == "tp1" else report_tp2(s, summary)


def recompute_flops(s, seq, mode):
    """Extra forward FLOPs of recompute per step (Megatron's hardware count minus the model count)."""
    m = mode if mode in ("full", "selective") else "none"
    return F.recompute_flops(m, s.get("mbs", 2) * s.get("m", 1), seq, s["layers"], s["hidden"])


# ----------------------------------------------------------------------------- form "tp2": TP2 +- SP, recompute
def repeat_tp2(ctx, s):
    out = {}
    for seq in s["seqs"]:
        for mode, flags in MODES.items():
            trace = ctx.path(f"s{seq}-{mode}", "trace.json")
            _, _, d = ctx.mcpp_run(f"s{seq}-{mode}", ["train", *model(s, seq), *flags, "--data-path", ctx.data,
                                                       "--timeline", trace], np_=2)
            st = runner.records(d, "pipeline_activation_memory")[-1]["stages"][0]
            ctx.planned.append((seq, mode, st["context_bytes"] == st["planned_context_bytes"]
                                and st["peak_bytes"] == st["planned_peak_bytes"]))
            if s.get("plan_cli"):
                p = plan(ctx, s, f"s{seq}-{mode}", seq, flags, 2)
                ctx.plan_cli.append(st["context_bytes"] == p["chunks"][0]["context_bytes"])
            out[f"ctx_kb_s{seq}_{mode}"] = st["context_bytes"] / 1024
            out[f"step_ms_s{seq}_{mode}"] = runner.records(d, "train")[-1]["elapsed_ms_per_iter"]
            ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("cat") == "collective" and e["pid"] == 0
                  and e["args"].get("step") == 1 and e["args"].get("group") == "tp"]
            out[f"ag_calls_s{seq}_{mode}"] = sum(e["name"].startswith("all_gather") for e in ev)
            out[f"rs_calls_s{seq}_{mode}"] = sum(e["name"].startswith("reduce_scatter") for e in ev)
    return out


def oracle_tp2(ctx, s, repeats):
    med = lambda k: F.median([r[k] for r in repeats])
    res = [check("activations measured = planned (per microbatch and peak), every cell", all(p for *_, p in ctx.planned),
                 f"{sum(p for *_, p in ctx.planned)}/{len(ctx.planned)} cells")]
    if s.get("plan_cli"):
        res.append(check("activations per microbatch = `mcpp plan memory`'s, every cell", all(ctx.plan_cli),
                         f"{sum(ctx.plan_cli)}/{len(ctx.plan_cli)} cells"))
    seqs = s["seqs"]
    res.append(check("SP saves activations at every s", all(med(f"ctx_kb_s{q}_sp") < med(f"ctx_kb_s{q}_tp2")
                                                            for q in seqs),
                     ", ".join(f"s{q}: {med(f'ctx_kb_s{q}_sp'):.0f} < {med(f'ctx_kb_s{q}_tp2'):.0f} KiB" for q in seqs)))
    res.append(check("full < selective < no recompute at every s", all(
        med(f"ctx_kb_s{q}_full") < med(f"ctx_kb_s{q}_selective") < med(f"ctx_kb_s{q}_sp") for q in seqs)))
    if s.get("attn", "unfused") == "unfused":
        share = [1 - med(f"ctx_kb_s{q}_selective") / med(f"ctx_kb_s{q}_sp") for q in seqs]
        res.append(check("selective recompute's saving grows with s (the s^2 term)",
                         all(a < b for a, b in zip(share, share[1:])), " < ".join(f"{x:.3f}" for x in share)))
    else:  # fused attention: selective drops the [b, np/t, s] float32 statistics of every layer, nothing else
        want = {q: s["layers"] * s.get("mbs", 2) * s.get("heads", 4) // 2 * q * 4 / 1024 for q in seqs}
        res.append(check("fused attention: selective saves exactly L b (np/t) s 4 bytes (the softmax statistics)",
                         all(abs(med(f"ctx_kb_s{q}_sp") - med(f"ctx_kb_s{q}_selective") - want[q]) < 1e-6
                             for q in seqs),
                         ", ".join(f"s{q}: {med(f'ctx_kb_s{q}_sp') - med(f'ctx_kb_s{q}_selective'):.1f} vs "
                                   f"{want[q]:.1f} KiB" for q in seqs)))
    L, M = s["layers"], s.get("m", 1)
    ok = all(repeats[0][f"ag_calls_s{q}_{m}"] == M * (4 * L + 2) and repeats[0][f"rs_calls_s{q}_{m}"] == M * (4 * L + 1)
             for q in seqs for m in ("sp", "selective"))
    res.append(check("SP: M(4L+2) all-gathers, M(4L+1) reduce-scatters per step", ok,
                     f"s{seqs[0]} sp: AG {repeats[0][f'ag_calls_s{seqs[0]}_sp']}, RS {repeats[0][f'rs_calls_s{seqs[0]}_sp']}"))
    return res


def negative_tp2(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    q = max(s["seqs"])
    a, b = med(f"step_ms_s{q}_full"), med(f"step_ms_s{q}_sp")
    return (f"Full recompute at s={q} when the activations already fit: it does not help the step "
            f"({a:.1f} ms vs {b:.1f} ms without; it saves {med(f'ctx_kb_s{q}_sp') - med(f'ctx_kb_s{q}_full'):.0f} KiB "
            f"per microbatch that no one needed).\n\nReason: it re-runs every layer's forward "
            f"({recompute_flops(s, q, 'full') / 1e6:.1f} MFLOP more per step): memory is traded for time, a win only "
            f"when the saved bytes let a larger micro-batch or model fit.\n")


def report_tp2(s, summary):
    st = summary["stats"]
    rows = ["| s | mode | activations / microbatch KiB | step ms | SP AG / RS per step | recompute MFLOP / step |",
            "|---:|---|---:|---:|---|---:|"]
    for q in s["seqs"]:
        for m in MODES:
            g = lambda k: st[f"{k}_s{q}_{m}"]["median"]
            rows.append(f"| {q} | {m} | {g('ctx_kb'):.1f} | {g('step_ms'):.1f} | {g('ag_calls'):.0f} / "
                        f"{g('rs_calls'):.0f} | {recompute_flops(s, q, m) / 1e6:.2f} |")
    return "## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\n## Activations\n\n" + "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- form "tp1": one GPU, recompute
CATEGORIES = ("param_bytes", "grad_bytes", "main_param_bytes", "optimizer_state_bytes")


def repeat_tp1(ctx, s):
    out = {}
    for seq in s["seqs"]:
        for mode, flags in MODES_TP1.items():
            name = f"s{seq}-{mode}"
            _, _, d = ctx.mcpp_run(name, ["train", *model(s, seq), *flags, "--data-path", ctx.data])
            st = runner.records(d, "pipeline_activation_memory")[-1]["stages"][0]
            last = runner.records(d, "train")[-1]
            p = plan(ctx, s, name, seq, flags, 1)
            ctx.planned.append((seq, mode, st["context_bytes"] == st["planned_context_bytes"]
                                and st["peak_bytes"] == st["planned_peak_bytes"]
                                and st["model_state_bytes"] == st["planned_model_state_bytes"]))
            ctx.plan_cli.append((seq, mode, st["context_bytes"] == p["chunks"][0]["context_bytes"]
                                 and st["peak_bytes"] == p["peak_activation_bytes"]))
            k = f"s{seq}_{mode}"
            out[f"ctx_mib_{k}"] = st["context_bytes"] / 2 ** 20
            out[f"act_peak_mib_{k}"] = st["peak_bytes"] / 2 ** 20
            out[f"state_mib_{k}"] = st["model_state_bytes"] / 2 ** 20
            out[f"peak_mib_{k}"] = last["memory"]["peak_bytes"] / 2 ** 20
            out[f"plan_mib_{k}"] = p["total_bytes"] / 2 ** 20
            out[f"plan_act_mib_{k}"] = p["peak_activation_bytes"] / 2 ** 20
            for c in CATEGORIES:
                out[f"plan_{c.replace('_bytes', '')}_mib_{k}"] = p[c] / 2 ** 20
            out[f"step_ms_{k}"] = last["elapsed_ms_per_iter"]
            out[f"tflops_{k}"] = last["tflops_per_gpu"]  # model FLOPs (Megatron's log line: recompute not counted)
            hw = F.gpt_flops_per_step(s["mbs"], seq, s["layers"], s["hidden"], s["vocab"]) + \
                recompute_flops(s, seq, mode)
            out[f"hw_tflops_{k}"] = hw / (last["elapsed_ms_per_iter"] / 1e3) / 1e12
    return out


def layer_slack_mib(s, med, seq):
    """2 x one layer's contexts (no recompute minus full recompute, over L) + the workspaces' allowance."""
    per_layer = (med(f"ctx_mib_s{seq}_none") - med(f"ctx_mib_s{seq}_full")) / s["layers"]
    return 2 * per_layer + s.get("workspace_mib", 512)


def oracle_tp1(ctx, s, repeats):
    med = lambda k: F.median([r[k] for r in repeats])
    seqs, L, b, heads = s["seqs"], s["layers"], s["mbs"], s["heads"]
    bad = [(q, m) for q, m, ok in ctx.planned if not ok]
    bad_cli = [(q, m) for q, m, ok in ctx.plan_cli if not ok]
    res = [check("contexts per microbatch, their peak and the model state = the trainer's plan (exact), every cell",
                 not bad, f"mismatched cells {bad}" if bad else f"{len(ctx.planned)} cells"),
           check("contexts per microbatch and their peak = `mcpp plan memory`'s (exact), every cell", not bad_cli,
                 f"mismatched cells {bad_cli}" if bad_cli else f"{len(ctx.plan_cli)} cells")]
    res.append(check("activations full < selective < none at every s", all(
        med(f"ctx_mib_s{q}_full") < med(f"ctx_mib_s{q}_selective") < med(f"ctx_mib_s{q}_none") for q in seqs),
        ", ".join(f"s{q}: {med(f'ctx_mib_s{q}_full'):.1f} < {med(f'ctx_mib_s{q}_selective'):.1f} < "
                  f"{med(f'ctx_mib_s{q}_none'):.1f} MiB" for q in seqs)))
    want = {q: L * b * heads * q * 4 / 2 ** 20 for q in seqs}
    res.append(check("selective (core_attn) saves exactly L b np s 4 bytes: the softmax statistics (no s^2 scores)",
                     all(abs(med(f"ctx_mib_s{q}_none") - med(f"ctx_mib_s{q}_selective") - want[q]) < 1e-9
                         for q in seqs),
                     ", ".join(f"s{q}: {med(f'ctx_mib_s{q}_none') - med(f'ctx_mib_s{q}_selective'):.3f} vs "
                               f"{want[q]:.3f} MiB" for q in seqs)))
    out_of = []
    for q in seqs:
        for m in MODES_TP1:
            pk, pl = med(f"peak_mib_s{q}_{m}"), med(f"plan_mib_s{q}_{m}")
            if not pl <= pk <= pl + layer_slack_mib(s, med, q):
                out_of.append(f"s{q} {m}: peak {pk:.0f} vs plan {pl:.0f} (+{layer_slack_mib(s, med, q):.0f}) MiB")
    res.append(check(f"device peak within [plan, plan + 2 x one layer's contexts + {s.get('workspace_mib', 512)} MiB], "
                     "every cell", not out_of, "; ".join(out_of) if out_of else ", ".join(
                         f"s{q} {m}: +{med(f'peak_mib_s{q}_{m}') - med(f'plan_mib_s{q}_{m}'):.0f}" for q in seqs
                         for m in MODES_TP1) + " MiB over the plan", device_only=True))
    res.append(check("device peak: full recompute < none at every s", all(
        med(f"peak_mib_s{q}_full") < med(f"peak_mib_s{q}_none") for q in seqs),
        ", ".join(f"s{q}: {med(f'peak_mib_s{q}_full'):.0f} < {med(f'peak_mib_s{q}_none'):.0f} MiB" for q in seqs),
        device_only=True))
    return res


def negative_tp1(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    q = max(s["seqs"])
    a, b = med(f"step_ms_s{q}_selective"), med(f"step_ms_s{q}_none")
    saved = med(f"ctx_mib_s{q}_none") - med(f"ctx_mib_s{q}_selective")
    verdict = "does not help" if saved < 0.01 * med(f"ctx_mib_s{q}_none") else "helps"
    return (f"Selective recompute (core_attn) on one GPU with cuDNN's fused attention at s={q}: it {verdict} "
            f"memory — "
            f"it saves {saved:.2f} MiB of {med(f'ctx_mib_s{q}_none'):.0f} MiB per microbatch "
            f"({100 * saved / med(f'ctx_mib_s{q}_none'):.2f} %), and the step takes {a:.1f} ms vs {b:.1f} ms without "
            f"(medians of {len(ctx.repeats)}).\n\nReason: the fused attention keeps no [b, np, s, s] scores, only its "
            f"output and the [b, np, s] float32 softmax statistics; recomputing core_attn drops just those statistics "
            f"while re-running the attention forward ({recompute_flops(s, q, 'selective') / 1e9:.0f} GFLOP a step). "
            f"The s^2 term selective recompute was designed for (Korthikanti et al. 2022) exists only with unfused "
            f"attention (the cpu tier). Full recompute saves "
            f"{med(f'ctx_mib_s{q}_none') - med(f'ctx_mib_s{q}_full'):.0f} MiB for a "
            f"{med(f'step_ms_s{q}_full'):.1f} ms step.\n")


def report_tp1(s, summary):
    st = summary["stats"]
    g = lambda k, f="{:.1f}": f.format(st[k]["median"]) if k in st else "-"
    rows = ["| s | recompute | activations / microbatch MiB | activation peak MiB (plan) | model state MiB | "
            "device peak MiB | plan total MiB | peak - plan MiB | step ms | model TFLOP/s | recompute GFLOP / step | "
            "hardware TFLOP/s |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for q in s["seqs"]:
        for m in MODES_TP1:
            k = f"s{q}_{m}"
            diff = st[f"peak_mib_{k}"]["median"] - st[f"plan_mib_{k}"]["median"] if f"peak_mib_{k}" in st else 0
            rows.append(f"| {q} | {m} | {g('ctx_mib_' + k)} | {g('act_peak_mib_' + k)} ({g('plan_act_mib_' + k)}) | "
                        f"{g('state_mib_' + k)} | {g('peak_mib_' + k, '{:.0f}')} | {g('plan_mib_' + k, '{:.0f}')} | "
                        f"{diff:+.0f} | {g('step_ms_' + k, '{:.2f}')} | {g('tflops_' + k)} | "
                        f"{recompute_flops(s, q, m) / 1e9:.1f} | {g('hw_tflops_' + k)} |")
    q = s["seqs"][0]
    names = [c.replace("_bytes", "") for c in CATEGORIES]
    cat = ", ".join(f"{n} {g(f'plan_{n}_mib_s{q}_none')}" for n in names)
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) +
            "\n\nTP1: no sequence parallelism (it splits "
            "the sequence over a tensor-parallel group; gpu-multi runs TP2 + SP).\n\n## Memory by category (plan, MiB)"
            f"\n\n{cat}; activations per cell below.\n\n## Cells\n\n" + "\n".join(rows) + "\n")
