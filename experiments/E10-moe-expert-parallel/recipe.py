"""E10: MoE top-2 of 8 experts at EP 1 / 2 / 4: expert load, all-to-all volume, drops.

Each repeat trains the same MoE GPT on 4 ranks (DP4, so the global batch is fixed) at EP 1, 2 and 4 (alltoall
dispatcher, dropless), and EP2 with --moe-expert-capacity-factor 1.0 (dropping), with --timeline.
Oracle:
  routing         the expert load (tokens per expert over all MoE layers) is identical at every EP, and the
                  losses equal EP1's (1e-5 relative): EP moves tokens, not math
  load            sum of tokens per expert = L_moe x tokens x top-k (dropless)
  a2a volume      per step, summed over the ranks, group ep, all_to_all: 4 h x L x tokens x top-k elements (each
                  routed copy goes out and back in the forward, and its gradient both ways in the backward); none
                  at EP1
  drops           with capacity factor 1.0 the trainer reports a dropped fraction > 0 (the load this run routes
                  exceeds ceil(tokens x k / E) on some experts)
"""
import json

import formulas as F
import runner
from runner import check

ID, TITLE = "E10", "MoE top-2 of 8 experts, EP 1/2/4"
KEY = ["a2a_elems_ep2", "a2a_elems_ep4", "load_cv", "dropped_fraction_cap"]
RANKS = 4


def model(s):
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads", "4",
            "--seq-length", str(s["seq"]), "--max-position-embeddings", str(s["seq"]), "--tokenizer-type",
            "NullTokenizer", "--vocab-size", "256", "--micro-batch-size", "2", "--global-batch-size",
            str(2 * RANKS), "--lr", "1e-3", "--lr-warmup-iters", "1", "--train-iters", "3", "--log-interval", "1",
            "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0", "--attention-dropout", "0",
            "--seed", "4", "--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
            "--moe-aux-loss-coeff", "0.01"]


TIERS = {"cpu": {"layers": 2, "hidden": 32, "seq": 32, "eps": [1, 2, 4]},
         "gpu": "EP > 1 needs several GPUs: run on nvidia-h100-x4 (EP 1 on one GPU is E01 with --num-experts)"}


def broken(s):
    s["ep4_extra"] = ["--moe-router-topk", "1"]  # EP4 routes differently from the reference
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", 256, tokens=30000)
    ctx.loads, ctx.losses = [], []


def run(ctx, s, name, ep, extra=()):
    trace = ctx.path(name, "trace.json")
    _, _, d = ctx.mcpp_run(name, ["train", *model(s), "--data-path", ctx.data, "--expert-model-parallel-size", str(ep),
                                  "--timeline", trace, *extra], np_=RANKS)
    recs = runner.records(d, "train")
    ev = [e for e in json.load(open(trace))["traceEvents"]
          if e.get("cat") == "collective" and e["args"].get("step") == 1 and e["name"] == "all_to_all ep"]
    return recs, sum(e["args"]["count"] for e in ev), len([e for e in ev if e["pid"] == 0])


def repeat(ctx, s):
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


def oracle(ctx, s, repeats):
    L, h, k = s["layers"], s["hidden"], 2
    tokens = 2 * RANKS * s["seq"]  # per step: global batch x s
    same_load = all(l[ep] == l[1] for l in ctx.loads for ep in s["eps"])
    same_loss = all(F.rel_err(b, a) <= 1e-5 for l in ctx.losses for ep in s["eps"] for a, b in zip(l[1], l[ep]))
    res = [check("expert load identical at every EP", same_load, f"EP1 iteration 2: {ctx.loads[0][1][1]}"),
           check("losses = EP1's (1e-5 relative)", same_loss),
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


def negative(ctx, s):
    med = lambda key: F.median([r[key] for r in ctx.repeats])
    a, b = med("step_ms_cap"), med("step_ms_ep2")
    verdict = "does not help" if a > 0.97 * b else "helps"
    return (f"Capacity factor 1.0 (dropping {med('dropped_fraction_cap') * 100:.1f} % of the routes) vs dropless at "
            f"EP2: dropping {verdict} the step ({a:.1f} ms vs {b:.1f} ms).\n\nReason: with the load this even "
            f"(cv {med('load_cv'):.2f}, max/mean {med('load_max_over_mean'):.2f}) the slowest expert is barely "
            f"above the mean, so capping it saves little work while the dropped tokens change the model's math.\n")


def report(s, summary, checks):
    st = summary["stats"]
    rows = ["| EP | step ms | all-to-all calls (rank 0) | all-to-all elements (all ranks) |", "|---:|---:|---:|---:|"]
    for ep in s["eps"]:
        g = lambda key: st[f"{key}_ep{ep}"]["median"]
        rows.append(f"| {ep} | {g('step_ms'):.1f} | {g('a2a_calls_rank0'):.0f} | {g('a2a_elems'):.0f} |")
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + f", {RANKS} ranks (DP4)\n\n## Runs\n\n" +
            "\n".join(rows) + f"\n\nExpert load (iteration 2, all layers): cv {st['load_cv']['median']:.3f}, max/mean "
            f"{st['load_max_over_mean']['median']:.3f}; capacity 1.0: dropped {st['dropped_fraction_cap']['median']:.3f}\n")
