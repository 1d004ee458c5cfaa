"""E09: context parallelism at a fixed global sequence: CP 1 / 2 / 4 on several ranks (cpu, gpu-multi), and on one GPU
(gpu) the attention kernels CP would split, checked against the CPU, with the memory and MFU over sequence lengths.

Form "cp" (cpu tier on CPU ranks; gpu-multi on 4 GPUs): each repeat trains the same model, sequence and global batch
at CP1, CP2 and CP4 with --cp-comm-type a2a (Megatron's; Ulysses) and CP2 with p2p (the ring), --timeline,
--peak-tflops 1 (nominal on CPU ranks).
Oracle:
  attention      every iteration's loss at every CP = the CP1 run's (1e-5 relative): the split attention is exact
  a2a volume     per step, group cp, all_to_all: 4 L M calls and 8 s b h L M / N elements per rank (forward: the
                 [s/N, b, 3h] q/k/v and the [s/N, b, h] context; backward: the same two reversed)
  memory         activations per microbatch measured = the planner's, and CP2 / CP4 hold less than CP1
The ring's volume is reported next to the all-to-all's (no closed form checked here).

Form "cp1" (gpu tier, one GPU, CP 1):
  attention   a small GPT (d 64 heads) at the fixed global sequence s = 2048 trained 3 steps on the GPU in fp32 (the
              mcpp CUDA flash kernels) and in bf16 (cuDNN's fused attention), against the same run on the CPU
              (float32, the CPU backend's blocked attention; run once in setup): every iteration's loss within 1e-5
              relative (fp32) and 1e-2 (bf16 rounding; the tolerance of CudaHeadDimTraining)
  sweep       GPT-2 124M shapes (bf16) at s = 1K / 2K / 4K / 8K with a fixed 8192 tokens per step (micro batch
              8192 / s): step time, Megatron's TFLOP/s and MFU (the log line's), the device peak, activations
  oracle      activations measured = planned (exact) at every s; the log line's TFLOP/s = Megatron's plain-GPT formula
              72 B s L h^2 (1 + s/(12h) + V/(12 L h)) / step time (1e-3); the device peak between the plan and
              1.25 x plan + 512 MiB (the plan leaves out the backward's transients and workspaces)
CP > 1 is gpu-multi's (refused on one GPU: CP splits the sequence over ranks, one GPU each).
"""
import json

import formulas as F
import runner
from runner import check

ID, TITLE = "E09", "context parallelism CP 1/2/4 (a2a) and the ring"
KEY = ["a2a_elems_cp2", "a2a_elems_cp4", "p2p_elems_cp2", "loss_max_rel_err", "loss_rel_err_fp32",
       "loss_rel_err_bf16", "mfu_s1024", "mfu_s8192"]
RUNS = {"cp1": (1, "a2a"), "cp2": (2, "a2a"), "cp4": (4, "a2a"), "cp2p2p": (2, "p2p")}


def model(s):
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads",
            str(s.get("heads", 4)), "--seq-length", str(s["seq"]), "--max-position-embeddings", str(s["seq"]),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "256", "--micro-batch-size", "2",
            "--global-batch-size", str(2 * s["m"]), "--lr", "1e-3", "--lr-warmup-iters", "1", "--train-iters", "3",
            "--log-interval", "1", "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--seed", "9", "--peak-tflops", "1", *s.get("device", [])]


TIERS = {"cpu": {"layers": 2, "hidden": 32, "seq": 128, "m": 1},
         "gpu": {"form": "cp1",
                 "check": {"layers": 2, "hidden": 256, "heads": 4, "seq": 2048, "vocab": 512, "mbs": 1, "iters": 3},
                 "sweep": {"layers": 12, "hidden": 768, "heads": 12, "vocab": 50304, "tokens": 8192,
                           "seqs": [1024, 2048, 4096, 8192], "iters": 6, "log": 3},
                 "device": ["--device", "cuda"], "bf16": ["--bf16"], "fp32_tol": 1e-5, "bf16_tol": 1e-2},
         "gpu-multi": {"layers": 4, "hidden": 512, "heads": 8, "seq": 8192, "m": 1, "loss_tol": 1e-4,
                       "device": ["--device", "cuda"], "gpus": 4,
                       "why_gpus": "CP 1 / 2 / 4 splits the sequence over ranks, one GPU each: run on nvidia-h100-x4 "
                                   "(one GPU: --tier gpu, the attention kernels at CP 1)"}}
# --smoke: the gpu tiers' code on CPU ranks (fp32, small shapes)
SMOKE = {"gpu": {"check": {"layers": 2, "hidden": 32, "heads": 4, "seq": 128, "vocab": 256, "mbs": 1, "iters": 3},
                 "sweep": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "tokens": 512, "seqs": [64, 128, 256],
                           "iters": 4, "log": 2}, "device": [], "bf16": []},
         "gpu-multi": {"layers": 2, "hidden": 32, "heads": 4, "seq": 128, "device": []}}


def broken(s):
    if s.get("form") == "cp1":
        s["fp32_extra"] = ["--attention-dropout", "0.5"]  # the fp32 run no longer computes the reference's attention
    elif s.get("gpus"):  # gpu-multi: its 1e-4 loss tolerance can hide a dropout's effect; half the sequence cannot
        s["cp4_extra"] = ["--seq-length", str(s["seq"] // 2)]  # CP4 no longer sees the reference's sequence
    else:
        s["cp4_extra"] = ["--attention-dropout", "0.2"]  # CP4 no longer computes the reference's attention
    return s


def setup(ctx, s):
    if s.get("form") == "cp1":
        return setup_cp1(ctx, s)
    ctx.data = runner.write_data(ctx.work + "/data/tok", 256, tokens=40000)
    ctx.plan_ok = []


def repeat(ctx, s):
    return repeat_cp1(ctx, s) if s.get("form") == "cp1" else repeat_cp(ctx, s)


def oracle(ctx, s, repeats):
    return oracle_cp1(ctx, s, repeats) if s.get("form") == "cp1" else oracle_cp(ctx, s, repeats)


def negative(ctx, s):
    return negative_cp1(ctx, s) if s.get("form") == "cp1" else negative_cp(ctx, s)


def report(s, summary, checks):
    return report_cp1(s, summary) if s.get("form") == "cp1" else report_cp(s, summary)


# ----------------------------------------------------------------------------- form "cp": CP 1 / 2 / 4 over ranks
def repeat_cp(ctx, s):
    out, losses = {}, {}
    for name, (n, kind) in RUNS.items():
        trace = ctx.path(name, "trace.json")
        extra = s.get("cp4_extra", []) if name == "cp4" else []
        _, _, d = ctx.mcpp_run(name, ["train", *model(s), "--data-path", ctx.data, "--context-parallel-size", str(n),
                                      "--cp-comm-type", kind, "--timeline", trace, *extra], np_=n)
        recs = runner.records(d, "train")
        losses[name] = [r["lm_loss"] for r in recs]
        out[f"step_ms_{name}"] = recs[-1]["elapsed_ms_per_iter"]
        out[f"tflops_{name}"] = recs[-1]["tflops_per_gpu"]
        st = runner.records(d, "pipeline_activation_memory")[-1]["stages"][0]
        out[f"ctx_kb_{name}"] = st["context_bytes"] / 1024
        ctx.plan_ok.append(st["context_bytes"] == st["planned_context_bytes"] and
                           st["peak_bytes"] == st["planned_peak_bytes"])
        ev = [e for e in json.load(open(trace))["traceEvents"]
              if e.get("cat") == "collective" and e["pid"] == 0 and e["args"].get("step") == 1]
        for op in ("all_to_all", "batch_p2p"):
            sel = [e for e in ev if e["name"] == f"{op} cp"]
            key = "a2a" if op == "all_to_all" else "p2p"
            if n > 1 and sel:
                out[f"{key}_calls_{name if kind == 'a2a' else 'cp2'}"] = len(sel)
                out[f"{key}_elems_{name if kind == 'a2a' else 'cp2'}"] = sum(e["args"]["count"] for e in sel)
    out["loss_max_rel_err"] = max(F.rel_err(b, a) for k in RUNS for a, b in zip(losses["cp1"], losses[k]))
    return out


def oracle_cp(ctx, s, repeats):
    L, M, sq, b, h = s["layers"], s["m"], s["seq"], 2, s["hidden"]
    tol = s.get("loss_tol", 1e-5)  # gpu-multi: fp32 GEMMs over s/N rows may take other cuBLAS kernels than CP1's
    res = [check(f"losses at CP2 / CP4 (a2a) and CP2 (ring) = CP1's ({tol:g} relative)".replace("e-0", "e-"),
                 all(r["loss_max_rel_err"] <= tol for r in repeats), f"max {max(r['loss_max_rel_err'] for r in repeats):.3g}")]
    for n in (2, 4):
        want = (4 * L * M, 8 * sq * b * h * L * M // n)
        got = [(r.get(f"a2a_calls_cp{n}"), r.get(f"a2a_elems_cp{n}")) for r in repeats]
        res.append(check(f"CP{n}: all-to-all calls / elements per step = 4LM / 8sbhLM/N", all(g == want for g in got),
                         f"got {got[0]}, want {want}"))
    res.append(check("activations measured = planned (every run)", all(ctx.plan_ok), f"{len(ctx.plan_ok)} runs"))
    med = lambda k: F.median([r[k] for r in repeats])
    res.append(check("CP2 and CP4 hold fewer activation bytes per rank than CP1",
                     med("ctx_kb_cp4") < med("ctx_kb_cp2") < med("ctx_kb_cp1"),
                     f"{med('ctx_kb_cp1'):.0f} > {med('ctx_kb_cp2'):.0f} > {med('ctx_kb_cp4'):.0f} KiB"))
    return res


def negative_cp(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    a, b = med("step_ms_cp2p2p"), med("step_ms_cp2")
    verdict = "does not help" if a > 0.97 * b else "helps"
    return (f"The ring (p2p) instead of the all-to-all at CP2, s={s['seq']}: it {verdict} (step {a:.1f} ms vs "
            f"{b:.1f} ms; per step it moves {med('p2p_elems_cp2'):.0f} elements vs {med('a2a_elems_cp2'):.0f}).\n\n"
            f"Reason: at this s the ring's K/V blocks are as large as the all-to-all's exchange and it pays N-1 "
            f"dependent steps plus the log-sum-exp merge; the ring pays off when heads are too few to split "
            f"(query groups < N) or at long s where its blocks overlap with the attention math.\n")


def report_cp(s, summary):
    st = summary["stats"]
    g = lambda k, f="{:.4g}": f.format(st[k]["median"]) if k in st else "-"
    rows = ["| run | step ms | TFLOP/s/rank (nominal) | activations / microbatch KiB | cp collective calls | elements |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, (n, kind) in RUNS.items():
        key = "a2a" if kind == "a2a" else "p2p"
        suf = name if kind == "a2a" else "cp2"
        rows.append(f"| {name} ({kind}) | {g('step_ms_' + name)} | {g('tflops_' + name)} | {g('ctx_kb_' + name)} | "
                    f"{g(f'{key}_calls_{suf}', '{:.0f}')} | {g(f'{key}_elems_{suf}', '{:.0f}')} |")
    return "## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\n## Runs\n\n" + "\n".join(rows) + "\n"


# ----------------------------------------------------------------------------- form "cp1": one GPU, CP 1
def gpt(c, seq, mbs, iters, log):
    return ["--num-layers", str(c["layers"]), "--hidden-size", str(c["hidden"]), "--num-attention-heads",
            str(c["heads"]), "--seq-length", str(seq), "--max-position-embeddings", str(seq), "--tokenizer-type",
            "NullTokenizer", "--vocab-size", str(c["vocab"]), "--micro-batch-size", str(mbs), "--global-batch-size",
            str(mbs), "--lr", "1e-3", "--lr-warmup-iters", "1", "--train-iters", str(iters), "--log-interval",
            str(log), "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0", "--attention-dropout", "0",
            "--seed", "9", "--context-parallel-size", "1"]


def check_model(s):
    c = s["check"]
    return gpt(c, c["seq"], c["mbs"], c["iters"], 1)


def setup_cp1(ctx, s):
    c, w = s["check"], s["sweep"]
    ctx.check_data = runner.write_data(ctx.work + "/data/check", c["vocab"],
                                       tokens=c["mbs"] * (c["seq"] + 1) * (c["iters"] + 2))
    ctx.sweep_data = runner.write_data(ctx.work + "/data/sweep", w["vocab"],
                                       tokens=w["tokens"] * (w["iters"] + 2) + max(w["seqs"]) + 1)
    # the reference: the same small GPT on the CPU backend (float32), once — it is deterministic
    _, _, d = ctx.mcpp_run("attn-cpu-reference", ["train", *check_model(s), "--data-path", ctx.check_data,
                                                  "--device", "cpu"])
    ctx.ref_losses = [r["lm_loss"] for r in runner.records(d, "train")]
    ctx.plan_ok, ctx.losses = [], []


def repeat_cp1(ctx, s):
    out, losses = {}, {}
    for name, flags in (("fp32", s.get("fp32_extra", [])), ("bf16", s["bf16"])):
        _, _, d = ctx.mcpp_run(f"attn-{name}", ["train", *check_model(s), "--data-path", ctx.check_data,
                                                *s["device"], *flags])
        losses[name] = [r["lm_loss"] for r in runner.records(d, "train")]
        out[f"loss_rel_err_{name}"] = max(F.rel_err(a, b) for a, b in zip(losses[name], ctx.ref_losses))
    ctx.losses.append(losses)
    w = s["sweep"]
    for q in w["seqs"]:
        mbs = w["tokens"] // q
        _, _, d = ctx.mcpp_run(f"s{q}", ["train", *gpt(w, q, mbs, w["iters"], w["log"]), "--data-path",
                                         ctx.sweep_data, *s["device"], *s["bf16"]])
        last = runner.records(d, "train")[-1]
        st = runner.records(d, "pipeline_activation_memory")[-1]["stages"][0]
        ctx.plan_ok.append((q, st["context_bytes"] == st["planned_context_bytes"]
                            and st["peak_bytes"] == st["planned_peak_bytes"]))
        plan = runner.records(d, "memory_plan")[0]["stages"][0]
        out[f"step_ms_s{q}"] = last["elapsed_ms_per_iter"]
        out[f"tflops_s{q}"] = last["tflops_per_gpu"]
        if "mfu" in last:  # known peak (a bf16 run on a known GPU); none on CPU ranks
            out[f"mfu_s{q}"] = last["mfu"]
        out[f"formula_tflops_s{q}"] = F.gpt_flops_per_step(mbs, q, w["layers"], w["hidden"], w["vocab"]) / (
            last["elapsed_ms_per_iter"] / 1e3) / 1e12
        out[f"peak_mib_s{q}"] = last["memory"]["peak_bytes"] / 2 ** 20
        out[f"plan_mib_s{q}"] = plan["total_bytes"] / 2 ** 20
        out[f"ctx_mib_s{q}"] = st["context_bytes"] / 2 ** 20
    return out


def oracle_cp1(ctx, s, repeats):
    med = lambda k: F.median([r[k] for r in repeats])
    seqs, c = s["sweep"]["seqs"], s["check"]
    res = []
    for name, tol, what in (("fp32", s["fp32_tol"], "the mcpp CUDA flash kernels"),
                            ("bf16", s["bf16_tol"], "cuDNN's fused attention")):
        res.append(check(f"s={c['seq']}: {name} ({what}) losses = the CPU reference's ({tol:g} relative), every "
                         "iteration", all(r[f"loss_rel_err_{name}"] <= tol for r in repeats),
                         f"max {max(r[f'loss_rel_err_{name}'] for r in repeats):.3g}; CPU {ctx.ref_losses}, "
                         f"{name} {ctx.losses[0][name]}"))
    bad = [q for q, ok in ctx.plan_ok if not ok]
    res.append(check("activations measured = planned (exact) at every s", not bad,
                     f"mismatched at s {bad}" if bad else f"{len(ctx.plan_ok)} runs"))
    res.append(check("log line's TFLOP/s = Megatron's 72 B s L h^2 (1 + s/12h + V/12Lh) / step time (1e-3)",
                     all(F.rel_err(r[f"tflops_s{q}"], r[f"formula_tflops_s{q}"]) <= 1e-3 for r in repeats for q in seqs),
                     ", ".join(f"s{q}: {med(f'tflops_s{q}'):.4g} vs {med(f'formula_tflops_s{q}'):.4g}" for q in seqs)))
    out_of = [f"s{q}: {med(f'peak_mib_s{q}'):.0f} vs plan {med(f'plan_mib_s{q}'):.0f}" for q in seqs
              if not med(f"plan_mib_s{q}") <= med(f"peak_mib_s{q}") <= 1.25 * med(f"plan_mib_s{q}") + 512]
    res.append(check("device peak within [plan, 1.25 x plan + 512 MiB] at every s", not out_of,
                     "; ".join(out_of) if out_of else ", ".join(
                         f"s{q}: {med(f'peak_mib_s{q}'):.0f} / {med(f'plan_mib_s{q}'):.0f} MiB" for q in seqs),
                     device_only=True))
    return res


def negative_cp1(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    seqs = s["sweep"]["seqs"]
    lo, hi = seqs[0], seqs[-1]
    a, b = med(f"tflops_s{hi}"), med(f"tflops_s{lo}")
    verdict = "does not help" if a < 1.03 * b else "helps"
    return (f"Longer sequences at a fixed {s['sweep']['tokens']} tokens per step on one GPU (s={hi}, micro batch "
            f"{s['sweep']['tokens'] // hi}, vs s={lo}, micro batch {s['sweep']['tokens'] // lo}): the longer sequence "
            f"{verdict} the throughput ({a:.1f} vs {b:.1f} TFLOP/s by Megatron's count; step {med(f'step_ms_s{hi}'):.1f} "
            f"vs {med(f'step_ms_s{lo}'):.1f} ms; activations {med(f'ctx_mib_s{hi}'):.0f} vs "
            f"{med(f'ctx_mib_s{lo}'):.0f} MiB).\n\nReason: the attention's FLOPs grow as s^2 (the s/(12h) term: "
            f"{hi / (12 * s['sweep']['hidden']):.2f} of the GEMM FLOPs at s={hi}) and the fused attention runs them "
            f"at a lower rate than the GEMMs, while the linear layers see the same token count either way; the "
            f"activations stay nearly flat (flash attention keeps no s^2 scores). Context parallelism is what "
            f"splits that s^2 work when one GPU's step gets too long.\n")


def report_cp1(s, summary):
    st = summary["stats"]
    g = lambda k, f="{:.4g}": f.format(st[k]["median"]) if k in st else "-"
    w, c = s["sweep"], s["check"]
    rows = ["| s | micro batch | step ms | TFLOP/s (log line) | formula TFLOP/s | MFU | activations MiB | device peak MiB "
            "| plan MiB |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for q in w["seqs"]:
        rows.append(f"| {q} | {w['tokens'] // q} | {g(f'step_ms_s{q}', '{:.2f}')} | {g(f'tflops_s{q}', '{:.1f}')} | "
                    f"{g(f'formula_tflops_s{q}', '{:.1f}')} | {g(f'mfu_s{q}', '{:.3f}')} | {g(f'ctx_mib_s{q}', '{:.0f}')} | "
                    f"{g(f'peak_mib_s{q}', '{:.0f}')} | {g(f'plan_mib_s{q}', '{:.0f}')} |")
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\nCP 1 (one GPU): no context-parallel "
            "group, so no KV exchange to count (gpu-multi runs CP 2 / 4).\n\n## Attention at s = " + str(c["seq"]) +
            f" against the CPU\n\nmax loss error fp32 {g('loss_rel_err_fp32', '{:.3g}')}, bf16 "
            f"{g('loss_rel_err_bf16', '{:.3g}')} (relative, over {c['iters']} iterations)\n\n## Sequence sweep "
            f"({w['tokens']} tokens per step)\n\n" + "\n".join(rows) + "\n")
