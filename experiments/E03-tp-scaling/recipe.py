"""E03: TP 1 / 2 / 4 at a fixed global batch: GEMM shapes, TP communication, FLOPs / MFU, peak memory.

Each repeat trains the same model and global batch at each TP size (1 DP rank, no SP) with --trace-modules and
--timeline, and --peak-tflops (a nominal per-rank peak, so the log line carries MFU on CPU ranks).
Oracle:
  GEMM shapes   the module trace's per-rank outputs: linear_qkv [s, b, 3h/t], linear_fc1 [s, b, 4h/t],
                output_layer [s, b, V/t] (Column parallel splits the output dim)
  TP comm       per step, group tp, all-reduce: M (4L + 5) calls and M ((4L + 2) s b h + 3 s b) elements (the
                analytic count of bench/comm_bytes.py: RowParallel fwd, ColumnParallel bwd, embedding, vocab CE)
  FLOPs / MFU   the trainer's TFLOP/s/GPU x step time x ranks = Megatron's 72 B s L h^2 (1 + s/(12h) + V/(12 L h));
                MFU = that / peak
  memory        the activation report: in flight, peak and per-microbatch bytes and the model state = the planner's
"""
import json

import formulas as F
import runner
from runner import check

ID, TITLE = "E03", "TP scaling at a fixed global batch"
KEY = ["step_ms_tp1", "step_ms_tp2", "step_ms_tp4", "tp_comm_ms_tp4"]
PEAK = 1.0  # TFLOP/s per rank, nominal: MFU on CPU ranks is a relative number


def model(s, tp):
    return ["--num-layers", str(s["layers"]), "--hidden-size", str(s["hidden"]), "--num-attention-heads", "8",
            "--seq-length", str(s["seq"]), "--max-position-embeddings", str(s["seq"]), "--tokenizer-type",
            "NullTokenizer", "--vocab-size", str(s["vocab"]), "--make-vocab-size-divisible-by", str(128 // tp),
            "--micro-batch-size", "2", "--global-batch-size", str(2 * s["m"]), "--lr", "1e-3", "--train-iters", "3",
            "--log-interval", "1", "--eval-iters", "0", "--split", "100,0,0", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--tensor-model-parallel-size", str(tp), "--peak-tflops", str(PEAK),
            *s.get("extra", [])]


TIERS = {"cpu": {"tps": [1, 2, 4], "layers": 2, "hidden": 64, "seq": 32, "vocab": 256, "m": 2},
         "gpu": "TP > 1 needs several GPUs: run on nvidia-h100-x8 (TP 1/2/4/8)"}


def broken(s):
    s["extra"] = ["--ffn-hidden-size", str(2 * s["hidden"])]  # not the 4h the shape / FLOP formulas assume
    return s


def setup(ctx, s):
    ctx.data = runner.write_data(ctx.work + "/data/tok", s["vocab"], tokens=20000)
    ctx.shapes, ctx.comm, ctx.plan = {}, {}, {}


def repeat(ctx, s):
    out = {}
    for tp in s["tps"]:
        trace = ctx.path(f"tp{tp}", "trace.json")
        _, _, d = ctx.mcpp_run(f"tp{tp}", ["train", *model(s, tp), "--data-path", ctx.data, "--trace-modules", "3",
                                           "--timeline", trace], np_=tp)
        step = runner.records(d, "train")[-1]
        out[f"step_ms_tp{tp}"] = step["elapsed_ms_per_iter"]
        out[f"tflops_tp{tp}"] = step["tflops_per_gpu"]
        out[f"mfu_tp{tp}"] = step.get("mfu", 0.0)
        out[f"peak_mb_tp{tp}"] = max(r["memory"]["peak_bytes"] for r in runner.records(d, "train", rank=0)) / 1e6
        mt = runner.records(d, "module_trace", rank=0)[0]["forward"]
        flat = {}
        stack = [mt]
        while stack:
            n = stack.pop()
            flat[n["name"]] = n["outputs"][0] if n["outputs"] else ""
            stack += n["children"]
        ctx.shapes.setdefault(tp, []).append(flat)
        ev = [e for e in json.load(open(trace))["traceEvents"]
              if e.get("cat") == "collective" and e["pid"] == 0 and e["args"].get("step") == 2]
        tpe = [e for e in ev if e["name"] == "all_reduce tp"]
        out[f"tp_calls_tp{tp}"] = len(tpe)
        out[f"tp_elems_tp{tp}"] = sum(e["args"]["count"] for e in tpe)
        out[f"tp_comm_ms_tp{tp}"] = F.length([(e["ts"], e["ts"] + e["dur"]) for e in tpe]) / 1e3
        mem = runner.records(d, "pipeline_activation_memory")[-1]["stages"][0]
        ctx.plan.setdefault(tp, []).append(all(mem.get("planned_" + k) == mem[k] for k in ("in_flight", "peak_bytes",
                                                                                             "context_bytes"))
                                           and 0 < mem["planned_model_state_bytes"] <= mem["model_state_bytes"]
                                           <= mem["planned_model_state_bytes"] * 1.001)
    return out


def oracle(ctx, s, repeats):
    sq, b, h, L, M = s["seq"], 2, s["hidden"], s["layers"], s["m"]
    V = -(-s["vocab"] // 128) * 128
    res = []
    for tp in s["tps"]:
        want = {"decoder.layers.0.self_attention.linear_qkv": [sq, b, 3 * h // tp],
                "decoder.layers.0.mlp.linear_fc1": [sq, b, 4 * h // tp], "output_layer": [sq, b, V // tp]}
        bad = [(k, f[k]) for f in ctx.shapes[tp] for k, v in want.items()
               if not f.get(k, "").endswith(f"[{', '.join(map(str, v))}]")]
        res.append(check(f"TP{tp}: GEMM output shapes split by t", not bad, f"{bad[:2]}" if bad else
                         ", ".join(f"{k.rsplit('.', 1)[-1]} {v}" for k, v in want.items())))
        calls, elems = (M * (4 * L + 5), M * ((4 * L + 2) * sq * b * h + 3 * sq * b)) if tp > 1 else (0, 0)
        got = [(r[f"tp_calls_tp{tp}"], r[f"tp_elems_tp{tp}"]) for r in repeats]
        res.append(check(f"TP{tp}: TP all-reduce calls / elements per step = analytic", all(g == (calls, elems)
                                                                                           for g in got),
                         f"got {got[0]}, want {(calls, elems)}"))
        flops = F.gpt_flops_per_step(b * M, sq, L, h, V)
        got = [r[f"tflops_tp{tp}"] * 1e12 * r[f"step_ms_tp{tp}"] / 1e3 * tp for r in repeats]
        res.append(check(f"TP{tp}: trainer's FLOPs = Megatron's formula (1e-3, the log's ms rounding)",
                         all(F.rel_err(g, flops) <= 1e-3 for g in got), f"{got[0]:.4g} vs {flops:.4g}"))
        res.append(check(f"TP{tp}: MFU = TFLOP/s / peak", all(abs(r[f"mfu_tp{tp}"] - r[f"tflops_tp{tp}"] / PEAK) <=
                                                                1e-6 * max(1.0, r[f"mfu_tp{tp}"]) for r in repeats),
                         f"{repeats[0][f'mfu_tp{tp}']:.4g}"))
        res.append(check(f"TP{tp}: memory = the planner's", all(ctx.plan[tp])))
    return res


def negative(ctx, s):
    med = lambda k: F.median([r[k] for r in ctx.repeats])
    t = {tp: med(f"step_ms_tp{tp}") for tp in s["tps"]}
    hi = max(s["tps"])
    verdict = "does not help" if t[hi] > 0.97 * t[1] else "helps"
    return (f"TP{hi} vs TP1 at h={s['hidden']} (same global batch): more tensor parallelism {verdict} (step "
            f"{t[hi]:.1f} ms vs {t[1]:.1f} ms; TP comm {med(f'tp_comm_ms_tp{hi}'):.1f} ms of it).\n\n"
            f"Reason: per rank the GEMMs shrink to h/t = {s['hidden'] // hi} columns while each layer keeps its "
            f"4 all-reduces of [s, b, h] (synchronous, not overlapped): the capacity gain (peak memory per rank) "
            f"is paid in exposed communication — the left end of the Pareto front.\n")


def report(s, summary, checks):
    st = summary["stats"]
    rows = ["| TP | step ms | TFLOP/s/rank | MFU (nominal 1 TFLOP/s peak) | TP AR calls | TP AR elements | "
            "TP comm ms (exposed: synchronous) | peak MB rank 0 |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for tp in s["tps"]:
        g = lambda k: st[f"{k}_tp{tp}"]["median"]
        rows.append(f"| {tp} | {g('step_ms'):.1f} | {g('tflops'):.4f} | {g('mfu'):.4f} | {g('tp_calls'):.0f} | "
                    f"{g('tp_elems'):.0f} | {g('tp_comm_ms'):.1f} | {g('peak_mb'):.1f} |")
    return "## Setup\n\n" + ", ".join(f"{k} {v}" for k, v in s.items()) + "\n\n## Per TP size\n\n" + "\n".join(rows) + "\n"
