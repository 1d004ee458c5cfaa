"""E10: MoE top-2 of 8 experts: EP 1 / 2 / 4 on several ranks (cpu, gpu-multi), the EP 1 kernels on one GPU (gpu).

Form "ep" (cpu tier on 4 CPU ranks; gpu-multi on 4 GPUs): each repeat trains the same MoE GPT on 4 ranks (DP4, so
the global batch is fixed) at EP 1, 2 and 4 (alltoall dispatcher, dropless), and EP2 with
--moe-expert-capacity-factor 1.0 (dropping), with --timeline.
Oracle:
  routing         the expert load (tokens per expert over all MoE layers) is identical at every EP, and the
                  losses equal EP1's (1e-5 relative): EP moves tokens, not math
  load            sum of tokens per expert = L_moe x tokens x top-k (dropless)
  a2a volume      per step, summed over the ranks, group ep, all_to_all: 4 h x L x tokens x top-k elements (each
                  routed copy goes out and back in the forward, and its gradient both ways in the backward); none
                  at EP1
  drops           with capacity factor 1.0 the trainer reports a dropped fraction > 0 (the load this run routes
                  exceeds ceil(tokens x k / E) on some experts)

Form "ep1" (gpu tier, one GPU; GPT-2 124M widths, 4 MoE layers, bf16, --deterministic-mode so both runs read the
same GEMM algorithms): per repeat three runs, --moe-per-layer-logging, log interval 1, one microbatch a step:
  seq      dropless, SequentialMLP (one cuBLASLt GEMM per expert and linear)
  grouped  dropless, --moe-grouped-gemm (one grouped launch per linear for the 8 experts)
  cap      --moe-expert-capacity-factor 1.0 (sequential, dropping)
Oracle:
  load        sum over layers and experts of the routes = L x tokens x k, every iteration (seq and grouped)
  grouped     = sequential: iteration 1's layer-0 load identical (the router precedes every expert GEMM) and the
              losses within 1e-2 relative (bf16: the grouped kernel and cuBLASLt round the experts differently)
  drops       capacity C = ceil(n k / E x 1.0) (Megatron's get_capacity); per layer and iteration the dropped
              fraction = sum_e max(0, T_e - C) / sum_e T_e exactly; dropless runs drop nothing
  aux loss    Megatron's switch loss, logged / coeff: E / (N^2 k) sum_e P_e T_e with sum_e P_e = N, so per layer
              E min_e T_e / (N k) <= load_balancing_loss <= E max_e T_e / (N k) (1e-5 slack: fp32 sums)
  memory      the sequential and the grouped runs' activations per microbatch = the planner's (exact: the same
              expert contexts, plus the router's device counts the grouped experts keep); the dropping run's are
              reported next to the plan (an upper bound with drops)
EP > 1 is gpu-multi's (refused on one GPU).
"""
import json
import math

import formulas as F
import runner
from runner import check

ID, TITLE = "E10", "MoE top-2 of 8 experts, EP 1/2/4"
KEY = ["a2a_elems_ep2", "a2a_elems_ep4", "load_cv", "dropped_fraction_cap", "step_ms_seq", "step_ms_grouped",
       "lb_loss_it1"]
RANKS = 4
EXPERTS, TOPK = 8, 2


def model(s):
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads",
            str(s.get("heads", 4)), "--seq-length", str(s["seq"]), "--max-position-embeddings", str(s["seq"]),
            "--tokenizer-type", "NullTokenizer", "--vocab-size", str(s.get("vocab", 256)), "--micro-batch-size",
            str(s.get("mbs", 2)), "--global-batch-size", str(s.get("gbs", 2 * RANKS)), "--lr", "1e-3",
            "--lr-warmup-iters", "1", "--train-iters", str(s.get("iters", 3)), "--log-interval", "1",
            "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0", "--attention-dropout", "0",
            "--seed", "4", "--num-experts", str(EXPERTS), "--moe-router-topk", str(TOPK), "--moe-ffn-hidden-size",
            str(s.get("ffn", 48)), "--moe-aux-loss-coeff", "0.01", *s.get("device", [])]


TIERS = {"cpu": {"layers": 2, "hidden": 32, "seq": 32, "eps": [1, 2, 4]},
         "gpu": {"form": "ep1", "layers": 4, "hidden": 768, "heads": 12, "seq": 1024, "vocab": 50304, "mbs": 4,
                 "gbs": 4, "ffn": 3072, "iters": 4, "capacity": 1.0,
                 "device": ["--device", "cuda", "--bf16", "--deterministic-mode"]},
         "gpu-multi": {"layers": 2, "hidden": 256, "heads": 4, "seq": 256, "ffn": 512, "eps": [1, 2, 4], "gpus": RANKS,
                       "loss_tol": 1e-4,
                       "device": ["--device", "cuda", "--deterministic-mode"],
                       "why_gpus": "EP 1 / 2 / 4 over 4 ranks (DP4) puts one rank on each GPU: run on nvidia-h100-x4 "
                                   "(EP 1 on one GPU: --tier gpu)"}}
# --smoke: the gpu tiers' code on CPU ranks (fp32, small shapes)
SMOKE = {"gpu": {"layers": 2, "hidden": 32, "heads": 4, "seq": 32, "vocab": 256, "ffn": 48, "iters": 3, "device": []},
         "gpu-multi": {"hidden": 32, "seq": 32, "ffn": 48, "device": []}}


def broken(s):
    if s.get("form") == "ep1":
        s["grouped_extra"] = ["--moe-router-topk", "1"]  # the grouped run routes differently from the sequential one
    else:
        s["ep4_extra"] = ["--moe-router-topk", "1"]  # EP4 routes differently from the reference
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", s.get("vocab", 256), tokens=max(30000, 4 * s.get("mbs", 2) *
                                                                                         s["seq"] * s.get("iters", 3)))
    ctx.loads, ctx.losses, ctx.recs, ctx.plan_exact = [], [], [], {}


def repeat(ctx, s):
    return repeat_ep1(ctx, s) if s.get("form") == "ep1" else repeat_ep(ctx, s)


def oracle(ctx, s, repeats):
    return oracle_ep1(ctx, s, repeats) if s.get("form") == "ep1" else oracle_ep(ctx, s, repeats)


def negative(ctx, s):
    med = lambda key: F.median([r[key] for r in ctx.repeats])
    ref = "step_ms_seq" if s.get("form") == "ep1" else "step_ms_ep2"
    where = "EP1 (one GPU)" if s.get("form") == "ep1" else "EP2"
    a, b = med("step_ms_cap"), med(ref)
    verdict = "does not help" if a > 0.97 * b else "helps"
    return (f"Capacity factor 1.0 (dropping {med('dropped_fraction_cap') * 100:.1f} % of the routes) vs dropless at "
            f"{where}: dropping {verdict} the step ({a:.1f} ms vs {b:.1f} ms).\n\nReason: with the load this even "
            f"(cv {med('load_cv'):.2f}, max/mean {med('load_max_over_mean'):.2f}) the slowest expert is barely "
            f"above the mean, so capping it saves little work while the dropped tokens change the model's math.\n")


def report(s, summary, checks):
    return report_ep1(s, summary) if s.get("form") == "ep1" else report_ep(s, summary)


# ----------------------------------------------------------------------------- form "ep": EP 1 / 2 / 4 on 4 ranks
def run(ctx, s, name, ep, extra=()):
    trace = ctx.path(name, "trace.json")
    _, _, d = ctx.mcpp_run(name, ["train", *model(s), "--data-path", ctx.data, "--expert-model-parallel-size", str(ep),
                                  "--timeline", trace, *extra], np_=RANKS)
    recs = runner.records(d, "train")
    ev = [e for e in json.load(open(trace))["traceEvents"]
          if e.get("cat") == "collective" and e["args"].get("step") == 1 and e["name"] == "all_to_all ep"]
    return recs, sum(e["args"]["count"] for e in ev), len([e for e in ev if e["pid"] == 0])


def repeat_ep(ctx, s):
    out, loads, losses = {}, {}, {}
    for ep in s["eps"]:
        recs, elems, calls = run(ctx, s, f"ep{ep}", ep, s.get("ep4_extra", []) if ep == 4 else [])
        loads[ep] = [r["moe_load"]["tokens_per_expert"] for r in recs]
        losses[ep] = [r["lm_loss"] for r in recs]
        out[f"a2a_elems_ep{ep}"], out[f"a2a_calls_rank0_ep{ep}"] = elems, calls
        out[f"step_ms_ep{ep}"] = recs[-1]["elapsed_ms_per_iter"]
    st = F.load_stats(loads[1][1])
    out["load_cv"], out["load_max_over_mean"] = st["cv"], st["max_over_mean"]
    out["tokens_routed"] = sum(loads[1][1])
    recs, _, _ = run(ctx, s, "ep2-cap1", 2, ["--moe-expert-capacity-factor", "1.0"])
    out["dropped_fraction_cap"] = recs[1]["moe_load"]["dropped_fraction"]
    out["step_ms_cap"] = recs[-1]["elapsed_ms_per_iter"]
    ctx.loads.append(loads)
    ctx.losses.append(losses)
    return out


def oracle_ep(ctx, s, repeats):
    L, h, k = s["layers"], s["hidden"], TOPK
    tokens = 2 * RANKS * s["seq"]  # per step: global batch x s
    same_load = all(l[ep] == l[1] for l in ctx.loads for ep in s["eps"])
    tol = s.get("loss_tol", 1e-5)  # gpu-multi: the experts' fp32 GEMMs over other row counts may take other kernels
    same_loss = all(F.rel_err(b, a) <= tol for l in ctx.losses for ep in s["eps"] for a, b in zip(l[1], l[ep]))
    res = [check("expert load identical at every EP", same_load, f"EP1 iteration 2: {ctx.loads[0][1][1]}"),
           check(f"losses = EP1's ({tol:g} relative)".replace("e-0", "e-"), same_loss),
           check("sum of tokens per expert = L x tokens x k", all(r["tokens_routed"] == L * tokens * k for r in repeats),
                 f"{repeats[0]['tokens_routed']:.0f} vs {L * tokens * k}")]
    for ep in s["eps"]:
        want = 0 if ep == 1 else 4 * h * L * tokens * k
        res.append(check(f"EP{ep}: all-to-all elements per step (all ranks) = {'0' if ep == 1 else '4 h L tokens k'}",
                         all(r[f"a2a_elems_ep{ep}"] == want for r in repeats),
                         f"{repeats[0][f'a2a_elems_ep{ep}']:.0f} vs {want}"))
    res.append(check("capacity factor 1.0 drops tokens (dropped fraction > 0)",
                     all(r["dropped_fraction_cap"] > 0 for r in repeats),
                     f"{F.median([r['dropped_fraction_cap'] for r in repeats]):.3f}"))
    return res


def report_ep(s, summary):
    st = summary["stats"]
    rows = ["| EP | step ms | all-to-all calls (rank 0) | all-to-all elements (all ranks) |", "|---:|---:|---:|---:|"]
    for ep in s["eps"]:
        g = lambda key: st[f"{key}_ep{ep}"]["median"]
        rows.append(f"| {ep} | {g('step_ms'):.1f} | {g('a2a_calls_rank0'):.0f} | {g('a2a_elems'):.0f} |")
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + f", {RANKS} ranks (DP4)\n\n## Runs\n\n" +
            "\n".join(rows) + f"\n\nExpert load (iteration 2, all layers): cv {st['load_cv']['median']:.3f}, max/mean "
            f"{st['load_max_over_mean']['median']:.3f}; capacity 1.0: dropped {st['dropped_fraction_cap']['median']:.3f}\n")


# ----------------------------------------------------------------------------- form "ep1": one GPU, EP 1
RUNS_EP1 = {"seq": [], "grouped": ["--moe-grouped-gemm"], "cap": ["--moe-expert-capacity-factor", "1.0"]}


def repeat_ep1(ctx, s):
    out, recs = {}, {}
    base = model(s) + ["--data-path", ctx.data, "--moe-per-layer-logging"]
    for name, flags in RUNS_EP1.items():
        extra = s.get("grouped_extra", []) if name == "grouped" else []
        _, _, d = ctx.mcpp_run(name, ["train", *base, *flags, *extra])
        recs[name] = runner.records(d, "train")
        last = recs[name][-1]
        out[f"step_ms_{name}"] = last["elapsed_ms_per_iter"]
        out[f"peak_mib_{name}"] = last["memory"]["peak_bytes"] / 2 ** 20
        mem = runner.records(d, "pipeline_activation_memory")[-1]["stages"][0]
        out[f"ctx_mib_{name}"] = mem["context_bytes"] / 2 ** 20
        out[f"planned_ctx_mib_{name}"] = mem["planned_context_bytes"] / 2 ** 20
        if name in ("seq", "grouped"):  # dropless: the plan is exact (with drops an upper bound)
            ctx.plan_exact.setdefault(name, []).append(mem["context_bytes"] == mem["planned_context_bytes"]
                                                       and mem["peak_bytes"] == mem["planned_peak_bytes"])
    it1 = recs["seq"][0]["moe_load"]
    st = F.load_stats(it1["tokens_per_expert"])
    out["load_cv"], out["load_max_over_mean"] = st["cv"], st["max_over_mean"]
    out["tokens_routed"] = sum(it1["tokens_per_expert"])
    out["dropped_fraction_cap"] = recs["cap"][0]["moe_load"]["dropped_fraction"]
    out["lb_loss_it1"] = recs["seq"][0]["load_balancing_loss"]
    out["loss_rel_err_grouped"] = max(F.rel_err(g["lm_loss"], q["lm_loss"]) for g, q in zip(recs["grouped"], recs["seq"]))
    ctx.recs.append(recs)
    return out


def layer_loads(rec):
    """{layer: tokens per expert} of a train record (--moe-per-layer-logging)."""
    return {l["layer"]: l["tokens_per_expert"] for l in rec.get("moe_load_layers", [])}


def oracle_ep1(ctx, s, repeats):
    n = s["mbs"] * s["seq"]  # tokens of the step's one microbatch
    L, E, k = s["layers"], EXPERTS, TOPK
    cap = F.expert_capacity(n, k, E, s["capacity"])
    routed, same_l0, drops, drop_bad, lb_bad, n_lb = True, True, True, [], [], 0
    for recs in ctx.recs:
        for name in ("seq", "grouped"):
            routed &= all(sum(r["moe_load"]["tokens_per_expert"]) == L * n * k for r in recs[name])
            drops &= all(r["moe_load"]["dropped_fraction"] == 0 for r in recs[name])
        same_l0 &= layer_loads(recs["seq"][0]).get(0) == layer_loads(recs["grouped"][0]).get(0) is not None
        for r in recs["cap"]:
            for l in r["moe_load_layers"]:
                want = F.dropped_fraction(l["tokens_per_expert"], cap)
                if abs(l["dropped_fraction"] - want) > 1e-9:
                    drop_bad.append((r["iteration"], l["layer"], l["dropped_fraction"], want))
        for r in recs["seq"]:
            lb = {x["layer"]: x["load_balancing_loss"] for x in r["moe_layers"]}
            for layer, t in layer_loads(r).items():
                lo, hi = F.switch_aux_loss_bounds(t, n, k)
                n_lb += 1
                if not lo * (1 - 1e-5) <= lb[layer] <= hi * (1 + 1e-5):
                    lb_bad.append((r["iteration"], layer, lb[layer], lo, hi))
    r0 = ctx.recs[0]
    tol = 1e-2  # bf16: the grouped kernel (mma.sync, fp32 accumulate) and cuBLASLt round each expert output apart
    lb0 = {x["layer"]: x["load_balancing_loss"] for x in r0["seq"][0]["moe_layers"]}
    lo0, hi0 = F.switch_aux_loss_bounds(layer_loads(r0["seq"][0])[0], n, k)
    return [
        check("routes = L x tokens x k every iteration (sequential and grouped, dropless)", routed,
              f"{repeats[0]['tokens_routed']:.0f} at iteration 1 vs {L * n * k}"),
        check("grouped GEMM = sequential: iteration 1's layer-0 expert load identical", same_l0,
              f"sequential {layer_loads(r0['seq'][0]).get(0)}, grouped {layer_loads(r0['grouped'][0]).get(0)}"),
        check(f"grouped GEMM = sequential: losses within {tol:g} relative (bf16)",
              all(r["loss_rel_err_grouped"] <= tol for r in repeats),
              f"max {max(r['loss_rel_err_grouped'] for r in repeats):.3g}"),
        check("dropless runs drop nothing", drops),
        check(f"capacity {s['capacity']:g}: dropped fraction = sum max(0, T_e - C) / sum T_e per layer, C = {cap}",
              not drop_bad and all(r["dropped_fraction_cap"] > 0 for r in repeats),
              f"mismatches (iteration, layer, got, want): {drop_bad[:4]}" if drop_bad else
              f"every layer and iteration; iteration 1: {repeats[0]['dropped_fraction_cap']:.4f}"),
        check("aux loss: E min T / (N k) <= load_balancing_loss <= E max T / (N k) per layer (Megatron's switch loss)",
              not lb_bad and n_lb > 0, f"violations (iteration, layer, loss, lo, hi): {lb_bad[:4]}" if lb_bad else
              f"{n_lb} layer-iterations; iteration 1 layer 0: {lo0:.4f} <= {lb0[0]:.4f} <= {hi0:.4f}"),
        *[check(f"{what} run: activations measured = planned (exact)", all(ctx.plan_exact.get(name, [False])),
                f"{repeats[0][f'ctx_mib_{name}']:.4f} MiB vs {repeats[0][f'planned_ctx_mib_{name}']:.4f}")
          for name, what in (("seq", "sequential"), ("grouped", "grouped GEMM"))],
    ]


def report_ep1(s, summary):
    st = summary["stats"]
    g = lambda key, f="{:.4g}": f.format(st[key]["median"]) if key in st else "-"
    rows = ["| run | step ms | device peak MiB | activations / microbatch MiB (measured / planned) |",
            "|---|---:|---:|---|"]
    for name, flags in RUNS_EP1.items():
        rows.append(f"| {name} ({' '.join(flags) or 'dropless, SequentialMLP'}) | {g('step_ms_' + name, '{:.2f}')} | "
                    f"{g('peak_mib_' + name, '{:.0f}')} | {g('ctx_mib_' + name, '{:.1f}')} / "
                    f"{g('planned_ctx_mib_' + name, '{:.1f}')} |")
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + ", one rank (EP 1)\n\n## Runs\n\n" +
            "\n".join(rows) + f"\n\nExpert load (iteration 1, all layers): cv {g('load_cv', '{:.3f}')}, max/mean "
            f"{g('load_max_over_mean', '{:.3f}')}; load-balancing loss (logged / coeff) {g('lb_loss_it1', '{:.4f}')}; "
            f"capacity {s['capacity']:g}: dropped {g('dropped_fraction_cap', '{:.4f}')}; grouped vs sequential loss "
            f"error {g('loss_rel_err_grouped', '{:.3g}')}\n")
