"""E08: plain data parallel vs the distributed optimizer (reduce-scatter grads / all-gather params) ± overlap.

Each repeat trains DP=d three ways from the same seed: plain DDP (bucketed all-reduce), --use-distributed-optimizer,
and the distributed optimizer with --overlap-grad-reduce --overlap-param-gather, all with small buckets
(--ddp-bucket-size) and --timeline; and asks `mcpp plan memory --json` for the same flags.
Metrics: bytes / param (the trainer's "memory per parameter per rank" line), model state measured vs planned,
buckets per step, DP collective elements per step, exposed DP comm (|comm \\ compute| of the timeline), step time.
Oracle:
  bytes / param = Megatron-Core's table (fp32 params + grads: 16 plain, 8 + 8/d distributed; bf16 + fp32 grads:
                  18 vs 6 + 12/d) and = the planner's (params + grads + main + optimizer bytes) / params
  model state measured = planned (the trainer's activation report, up to bucket padding 0.1 %)
  the reduce-scatter + all-gather elements equal the plain all-reduce's bucket elements (up to padding to a
  multiple of d per bucket), so the ring bytes per rank of RS + AG = those of AR: 2(d-1)/d x buffer bytes
  the same losses (1e-5 relative) in all three runs: sharding the optimizer changes no math
"""
import json

import formulas as F
import runner
from runner import check

ID, TITLE = "E08", "plain DP vs distributed optimizer"
KEY = ["bpp_plain", "bpp_dist", "buckets", "exposed_ms_dist", "exposed_ms_overlap"]
MODES = {"plain": [], "dist": ["--use-distributed-optimizer"],
         "overlap": ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]}


def model(s):
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads", "4",
            "--seq-length", str(s["seq"]), "--max-position-embeddings", str(s["seq"]), "--tokenizer-type",
            "NullTokenizer", "--vocab-size", str(s["vocab"]), "--micro-batch-size", "2", "--global-batch-size",
            str(4 * s["dp"]), "--lr", "1e-3", "--lr-warmup-iters", "1", "--train-iters", "3", "--log-interval", "1",
            "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0", "--attention-dropout", "0",
            "--seed", "3", "--ddp-bucket-size", str(s["bucket"]), *s.get("device", [])]


def gpu_tier():
    """One GPU shows the memory side at d = 1 only (bytes / param of both; the d > 1 shard needs more GPUs)."""
    return {"dp": 1, "layers": 12, "hidden": 768, "seq": 1024, "vocab": 50257, "bucket": 40000000,
            "device": ["--device", "cuda", "--bf16"], "dtypes": ["bf16", "fp32"]}


TIERS = {"cpu": {"dp": 2, "layers": 2, "hidden": 64, "seq": 32, "vocab": 256, "bucket": 20000,
                 "dtypes": ["fp32", "fp32"]},
         "gpu": gpu_tier}


def broken(s):
    s["dtypes"] = ["bf16", "fp32"]  # the table row of another precision: the bytes / param must disagree
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", s["vocab"], tokens=20000)
    ctx.plan_ok, ctx.losses = [], []


def dp_events(trace, step):
    ev = json.load(open(trace))["traceEvents"]
    coll = [e for e in ev if e.get("cat") == "collective" and e["pid"] == 0 and e["args"].get("step") == step]
    comp = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") in ("forward", "backward") and e["pid"] == 0
            and e["args"].get("step") == step]
    return coll, comp


def bpp_line(out):
    for line in out.splitlines():
        if line.startswith("memory per parameter per rank"):
            return float(line.rsplit("=", 1)[1].split()[0])
    raise runner.RunFailed("no 'memory per parameter per rank' line")


def repeat(ctx, s):
    out, losses = {}, {}
    np_ = s["dp"]
    for mode, flags in MODES.items():
        trace = ctx.path(mode, "trace.json")
        _, outs, d = ctx.mcpp_run(mode, ["train", *model(s), "--data-path", ctx.data, *flags, "--timeline", trace],
                                  np_=np_)
        out[f"bpp_{mode}"] = bpp_line("\n".join(outs.values()))
        steps = runner.records(d, "train")
        losses[mode] = [r["lm_loss"] for r in steps]
        out[f"step_ms_{mode}"] = steps[-1]["elapsed_ms_per_iter"]
        mem = runner.records(d, "pipeline_activation_memory")[-1]["stages"][0]
        out[f"model_state_{mode}"], out[f"planned_state_{mode}"] = mem["model_state_bytes"], mem[
            "planned_model_state_bytes"]
        coll, comp = dp_events(trace, 1)  # a middle step: overlap gathers the params of step k in step k+1
        dpc = [e for e in coll if e["args"]["group"] == "dp_cp"]
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            sel = [e for e in dpc if e["name"].startswith(op)]
            out[f"{mode}_{op}_calls"] = len(sel)
            out[f"{mode}_{op}_elems"] = sum(e["args"]["count"] for e in sel)
        grad = [(e["ts"], e["ts"] + e["dur"]) for e in dpc if not e["name"].startswith("all_reduce") or mode == "plain"]
        out[f"exposed_ms_{mode}"] = F.exposed_comm(grad, comp) / 1e3
        plan = json.loads(ctx.mcpp_run(mode + "-plan", ["plan", "memory", "--world", str(np_), "--json", *model(s),
                                                        *flags], metrics=False)[1][0])
        st = plan["stages"][0]
        out[f"plan_bpp_{mode}"] = (st["param_bytes"] + st["grad_bytes"] + st["main_param_bytes"] +
                                   st["optimizer_state_bytes"]) / st["params"]
        if ctx.rep == "r0":
            ctx.keep_file(trace, f"{mode}.trace.json")
    out["buckets"] = out["dist_reduce_scatter_calls"]
    out["params"] = st["params"]
    ctx.losses.append(losses)
    return out


def oracle(ctx, s, repeats):
    r, d = repeats[0], s["dp"]
    pd, gd = s["dtypes"]
    want_plain, want_dist = F.bytes_per_param(pd, gd, d, False), F.bytes_per_param(pd, gd, d, True)
    res = [check(f"bytes/param plain = Megatron's table ({pd} params, {gd} grads): {want_plain:g}",
                 all(x["bpp_plain"] == want_plain for x in repeats), f"trainer {r['bpp_plain']:g}"),
           check(f"bytes/param distributed = {want_dist:g} (d={d})", all(abs(x["bpp_dist"] - want_dist) < 1e-9
                                                                          for x in repeats), f"trainer {r['bpp_dist']:g}"),
           check("planner's bytes/param = the trainer's", all(abs(x[f"plan_bpp_{m}"] - x[f"bpp_{m}"]) < 1e-9
                                                              for x in repeats for m in MODES),
                 ", ".join(f"{m} {r[f'plan_bpp_{m}']:.4g}" for m in MODES))]
    res.append(check("model state measured = planned (bucket padding <= 0.1 %)", all(
        0 < x[f"planned_state_{m}"] <= x[f"model_state_{m}"] <= x[f"planned_state_{m}"] * 1.001
        for x in repeats for m in MODES), ", ".join(f"{m} {r[f'model_state_{m}']}/{r[f'planned_state_{m}']}" for m in MODES)))
    if d > 1:
        ar = r["plain_all_reduce_elems"]  # (the distributed optimizer adds one scalar all-reduce: the grad norm)
        rs, ag = r["dist_reduce_scatter_elems"], r["dist_all_gather_elems"] * d  # AG counts this rank's shard
        pad = r["buckets"] * d
        res.append(check("RS elements = plain AR bucket elements (padding to d per bucket)",
                         r["params"] <= ar and 0 <= rs - ar <= pad, f"AR {ar}, RS {rs}, params {r['params']}, "
                         f"{r['buckets']} buckets"))
        res.append(check("AG elements x d = RS elements (each rank gathers its shard)", ag == rs, f"AG x d {ag}, RS {rs}"))
        b_ar = F.ring_bytes_per_rank("all_reduce", d, 4 * ar)
        b_rsag = F.ring_bytes_per_rank("reduce_scatter", d, 4 * rs) + F.ring_bytes_per_rank("all_gather", d, 4 * rs)
        res.append(check("ring bytes/rank RS + AG = AR (within padding)", abs(b_rsag - b_ar) <= 8 * pad,
                         f"{b_rsag:.0f} vs {b_ar:.0f} bytes"))
        res.append(check("buckets: same count for AR, RS, AG", r["plain_all_reduce_calls"]
                         == r["dist_reduce_scatter_calls"] == r["dist_all_gather_calls"] > 1, f"{r['buckets']} buckets"))
    same = all(F.rel_err(a, b) <= 1e-5 for l in ctx.losses for m in MODES for a, b in zip(l[m], l["plain"]))
    res.append(check("losses equal across plain / distributed / overlap (1e-5)", same, f"{ctx.losses[0]}"))
    return res


def negative(ctx, s):
    """Ten times more buckets (--ddp-bucket-size / 10) with the distributed optimizer and overlap."""
    small = dict(s, bucket=max(1, s["bucket"] // 10))
    ms = []
    for k in range(3):
        _, _, d = ctx.mcpp_run(f"small-buckets-{k}", ["train", *model(small), "--data-path", ctx.data,
                                                      *MODES["overlap"]], np_=s["dp"])
        ms.append(runner.records(d, "train")[-1]["elapsed_ms_per_iter"])
    tb, ta = F.median(ms), F.median([x["step_ms_overlap"] for x in ctx.repeats])
    verdict = "does not help" if tb > 0.97 * ta else "helps"
    return (f"--ddp-bucket-size {small['bucket']} instead of {s['bucket']} (distributed optimizer + overlap, d={s['dp']}): "
            f"smaller buckets {verdict} (step {tb:.2f} ms vs {ta:.2f} ms, medians of 3).\n\n"
            f"Reason: more buckets start the first reduce-scatter earlier, but each collective pays its latency "
            f"(MPI's ~tens of us per call on shared cores) and the backward here is too short to hide more calls; "
            f"Megatron's default bucket is 40M elements (max(40M, 1M x d)) for that reason.\n")


def report(s, summary, checks):
    st = summary["stats"]
    g = lambda k, f="{:.4g}": f.format(st[k]["median"]) if k in st else "-"
    rows = ["| mode | bytes/param (trainer) | planner | model state B | planned B | AR / RS / AG calls | "
            "AR / RS / AG elements | exposed DP comm ms | step ms |", "|---|---:|---:|---:|---:|---|---|---:|---:|"]
    for m in MODES:
        rows.append(f"| {m} | {g('bpp_' + m)} | {g('plan_bpp_' + m)} | {g('model_state_' + m, '{:.0f}')} | "
                    f"{g('planned_state_' + m, '{:.0f}')} | " +
                    " / ".join(g(f"{m}_{o}_calls", "{:.0f}") for o in ("all_reduce", "reduce_scatter", "all_gather")) +
                    " | " + " / ".join(g(f"{m}_{o}_elems", "{:.0f}") for o in ("all_reduce", "reduce_scatter", "all_gather"))
                    + f" | {g('exposed_ms_' + m)} | {g('step_ms_' + m)} |")
    note = ("\nNote: with --overlap-param-gather the timeline (--timeline) records no all-gather events (0 calls in "
            "the overlap row), so that row's exposed comm covers the reduce-scatters only.\n")
    return "## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\n## Memory and DP communication\n\n" + \
        "\n".join(rows) + "\n" + note
