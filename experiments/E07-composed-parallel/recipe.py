"""E07: TP2 x PP2 x DP2 (8 ranks) at a fixed global batch: groups and their order, loss, each comm kind.

Each repeat trains the same model and global batch on 1 rank and on TP2 x PP2 x DP2 (order tp-cp-ep-dp-pp,
Megatron's default) with --timeline, and asks `mcpp plan ranks` / `mcpp plan memory` for the layout.
Oracle:
  groups   `mcpp plan ranks` (the RankGenerator the trainer builds its communicators with) = Megatron-Core's
           parallel_state transcription in tests/oracle/parallel_state/megatron_ranks.py (tp, pp, dp, mp, embd)
  loss     every iteration's loss = the 1-rank run's (1e-5 relative: DESIGN.md's central oracle)
  comm     every kind a composed step needs appears on every rank: TP all-reduce (RowParallel), PP batched P2P,
           DP gradient all-reduce, the tied embedding's all-reduce between the first and last stage; and the DP
           all-reduce moves exactly the stage's TP-local parameter count per step (plain DDP: no padding) as the
           memory planner counts it
"""
import json
import os
import subprocess
import sys

import formulas as F
import runner
from runner import check

ID, TITLE = "E07", "TP2 x PP2 x DP2 composed"
KEY = ["loss_max_rel_err", "step_ms_8", "step_ms_1"]
LAYOUT = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]


def model(s):
    return ["--num-layers", "4", "--hidden-size", str(s["hidden"]), "--num-attention-heads", "4", "--seq-length",
            str(s["seq"]), "--max-position-embeddings", str(s["seq"]), "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "256", "--make-vocab-size-divisible-by", "64", "--micro-batch-size", "2",
            "--global-batch-size", str(s["gbs"]), "--lr", "1e-3", "--lr-warmup-iters", "1", "--train-iters", "3",
            "--log-interval", "1", "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--seed", "5"]


TIERS = {"cpu": {"hidden": 32, "seq": 16, "gbs": 8},
         "gpu": "TP2 x PP2 x DP2 needs 8 GPUs: run on nvidia-h100-x8"}


def broken(s):
    s["ref_extra"] = ["--global-batch-size", str(2 * s["gbs"])]  # the reference is another global batch
    return s


def parse_groups(text):
    """{"groups": {kind: [[ranks]]}} from `mcpp plan ranks`'s "groups:" block ("tp (4 x 2): [0,1] [2,3] ...")."""
    out, on = {}, False
    for line in text.splitlines():
        if line.startswith("groups:"):
            on = True
        elif on and "):" in line:
            kind, rest = line.split(" (", 1)
            out[kind.strip()] = [json.loads(g) for g in rest.split("):", 1)[1].split()]
    return {"groups": out}


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", 256, tokens=20000)
    plan = subprocess.run([ctx.mcpp, "plan", "ranks", "--world", "8", "--tp", "2", "--pp", "2"],
                          capture_output=True, text=True)
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable  # numpy (Debian's here)
    oracle = subprocess.run([py, os.path.join(runner.ROOT, "tests", "oracle", "parallel_state",
                                                          "megatron_ranks.py"), "--world", "8", "--tp", "2", "--pp", "2"],
                            capture_output=True, text=True)
    ctx.groups = (parse_groups(plan.stdout), json.loads(oracle.stdout or "{}"), oracle.stderr[-300:])
    with open(os.path.join(ctx.out, "cmd.txt"), "a") as f:
        f.write(f"[setup] {ctx.mcpp} plan ranks --world 8 --tp 2 --pp 2 --json; megatron_ranks.py --world 8 --tp 2 --pp 2\n")
    mem = subprocess.run([ctx.mcpp, "plan", "memory", "--world", "8", "--json", *model(s), *LAYOUT],
                         capture_output=True, text=True)
    ctx.stage_params = [st["params"] for st in json.loads(mem.stdout)["stages"]]
    ctx.comm_ok = []


def repeat(ctx, s):
    _, _, d1 = ctx.mcpp_run("one", ["train", *model(s), "--data-path", ctx.data, *s.get("ref_extra", [])])
    trace = ctx.path("eight", "trace.json")
    _, _, d8 = ctx.mcpp_run("eight", ["train", *model(s), "--data-path", ctx.data, *LAYOUT, "--timeline", trace], np_=8)
    a = {r["iteration"]: r for r in runner.records(d1, "train")}
    b = {r["iteration"]: r for r in runner.records(d8, "train")}
    out = {"loss_max_rel_err": max(F.rel_err(b[i]["lm_loss"], a[i]["lm_loss"]) if i in b else float("inf") for i in a),
           "step_ms_1": a[3]["elapsed_ms_per_iter"], "step_ms_8": b[3]["elapsed_ms_per_iter"]}
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("cat") == "collective" and e["args"].get("step") == 1]
    ok = True
    for rank in range(8):
        mine = [e for e in ev if e["pid"] == rank]
        kinds = {e["name"] for e in mine}
        stage = rank // 4  # order tp-cp-ep-dp-pp: pp is the slowest dimension
        need = {"all_reduce tp", "batch_p2p pp", "all_reduce dp_cp", "all_reduce embd"}
        ok &= need <= kinds
        dp = sum(e["args"]["count"] for e in mine if e["name"] == "all_reduce dp_cp")
        ok &= dp == ctx.stage_params[stage]
        for e in mine:
            key = f"rank{rank}_{e['name'].replace(' ', '__')}"
            out[key + "_calls"] = out.get(key + "_calls", 0) + 1
            out[key + "_elems"] = out.get(key + "_elems", 0) + e["args"].get("count", 0)
    ctx.comm_ok.append(ok)
    if ctx.rep == "r0":
        ctx.keep_file(trace, "eight.trace.json")
    return out


def oracle(ctx, s, repeats):
    got, want, err = ctx.groups
    kinds = ["tp", "pp", "dp", "mp", "embd"]
    diff = {k: (got.get("groups", {}).get(k), want.get("groups", {}).get(k)) for k in kinds
            if got.get("groups", {}).get(k) != want.get("groups", {}).get(k)}
    return [check("groups (tp, pp, dp, mp, embd) = Megatron-Core's RankGenerator", want and not diff,
                  f"differ: {diff} {err}" if diff or not want else
                  f"tp {want['groups']['tp']}, pp {want['groups']['pp']}, dp {want['groups']['dp']}"),
            check("losses = the 1-rank run's (1e-5 relative)", all(r["loss_max_rel_err"] <= 1e-5 for r in repeats),
                  f"max {max(r['loss_max_rel_err'] for r in repeats):.3g}"),
            check("every rank runs TP AR, PP P2P, DP AR, embedding AR; DP AR elements = the stage's params",
                  all(ctx.comm_ok), f"stage params {ctx.stage_params}")]


def negative(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    t8, t1 = med("step_ms_8"), med("step_ms_1")
    verdict = "does not help" if t8 > 0.97 * t1 else "helps"
    return (f"8 ranks (TP2 x PP2 x DP2) vs 1 rank for the same global batch of {s['gbs']}: the composed layout "
            f"{verdict} (step {t8:.1f} ms vs {t1:.1f} ms, medians).\n\nReason: 8 processes on {os.cpu_count()} "
            f"cores, a model of h={s['hidden']}: every step pays TP all-reduces per layer, P2P per microbatch and "
            f"the DP / embedding all-reduces, none of which the tiny GEMMs can amortize.\n")


def report(s, summary, checks):
    st = summary["stats"]
    rows = ["| rank | collective | calls / step | elements / step |", "|---:|---|---:|---:|"]
    for k in sorted(st):
        if k.endswith("_calls") and k.startswith("rank"):
            base = k[:-6]
            r, name = base.split("_", 1)
            rows.append(f"| {r[4:]} | {name.replace('__', ' ')} | {st[k]['median']:.0f} | "
                        f"{st[base + '_elems']['median']:.0f} |")
    return ("## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + ", TP2 x PP2 x DP2, order tp-cp-ep-dp-pp\n\n"
            + runner.stats_table(summary, KEY) + "\n## Collectives of step 2, per rank\n\n" + "\n".join(rows) + "\n")
