"""The experiments' formulas (issue 34, item 2): every recipe computes its metrics and oracles through these
functions, and tests/experiments (experiments/lib/test_formulas.py) checks each on fixed inputs.

Stdlib only (the GPU tier runs on the device machine's plain python3). Sources:
  bubble          Megatron / Narayanan et al. 2021: (p - 1) / (V*m + p - 1) for 1F1B (V = virtual stages);
                  measured = 1 - busy / span per stage (tools/trace_summary.h's definition).
  bytes / param   Megatron-Core docs/source/api-guide/dist_optimizer.md's table: per parameter, model + grad
                  + optimizer bytes; distributed optimizer shards the fp32 main params + Adam moments over d.
  comm bytes      ring collectives per rank: all-reduce 2(n-1)/n * S, reduce-scatter / all-gather (n-1)/n * S.
  MFU             Megatron's num_floating_point_operations for plain GPT (docs/OBSERVABILITY.md):
                  72 B s L h^2 (1 + s/(12h) + V/(12 L h)) per step, over (step seconds x peak x ranks).
  exposed comm    |comm \\ compute| of a timeline: comm time not covered by the union of compute intervals.
  recompute       the forward FLOPs activation recompute adds (Megatron's hardware_floating_point_operations minus
                  the model's): full = one more forward of every layer, selective (core_attn) = the attention core's.
  MoE             Megatron-Core moe_utils: get_capacity, the capacity drop, switch_load_balancing_loss_func's bounds.
"""
import math


# ----------------------------------------------------------------------------- statistics
def median(xs):
    s = sorted(xs)
    if not s:
        raise ValueError("median of nothing")
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def mad(xs):
    """Median absolute deviation (unscaled)."""
    m = median(xs)
    return median([abs(x - m) for x in xs])


def spread(xs):
    """{'median', 'min', 'max', 'mad', 'rel_spread' = (max - min) / |median|} of the repeats' values."""
    m = median(xs)
    return {"median": m, "min": min(xs), "max": max(xs), "mad": mad(xs),
            "rel_spread": (max(xs) - min(xs)) / abs(m) if m else 0.0, "n": len(xs)}


def summarize_repeats(repeats):
    """repeats: [{metric: number, ...}] -> {metric: spread(values)} for every numeric metric all repeats have."""
    keys = [k for k, v in repeats[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return {k: spread([r[k] for r in repeats]) for k in keys if all(k in r for r in repeats)}


def rel_err(got, ref):
    """|got - ref| / max(|ref|, tiny)."""
    return abs(got - ref) / max(abs(ref), 1e-300)


# ----------------------------------------------------------------------------- pipeline
def bubble_theoretical(pp, microbatches, vpp=1):
    """Megatron's 1F1B bubble fraction (p - 1) / (V*m + p - 1)."""
    if pp < 1 or microbatches < 1 or vpp < 1:
        raise ValueError(f"bubble: pp {pp}, microbatches {microbatches}, vpp {vpp} must be >= 1")
    return (pp - 1) / (vpp * microbatches + pp - 1)


def bubble_measured(busy_ms, span_ms):
    """1 - busy / span (a stage's idle share of the schedule's span)."""
    if span_ms <= 0:
        raise ValueError("bubble: empty span")
    return 1.0 - busy_ms / span_ms


# ----------------------------------------------------------------------------- memory
# (param bytes, grad bytes) -> (non-distributed bytes/param, distributed (a, b): a + b/d); Megatron's table.
_BYTES_PER_PARAM = {
    ("fp16", "fp16"): (20, (4, 16)),
    ("bf16", "fp32"): (18, (6, 12)),
    ("fp32", "fp32"): (16, (8, 8)),
}


def bytes_per_param(param_dtype, grad_dtype, dp, distributed):
    """Model + grad + Adam state bytes per parameter (Megatron-Core's distributed-optimizer table)."""
    try:
        plain, (a, b) = _BYTES_PER_PARAM[(param_dtype, grad_dtype)]
    except KeyError:
        raise ValueError(f"bytes/param: no row for params {param_dtype}, grads {grad_dtype}") from None
    if dp < 1:
        raise ValueError(f"bytes/param: dp {dp} < 1")
    return a + b / dp if distributed else float(plain)


# ----------------------------------------------------------------------------- communication
def ring_bytes_per_rank(op, n, size_bytes):
    """Bytes each rank sends in a ring collective of a size_bytes buffer over n ranks."""
    if n < 1:
        raise ValueError(f"collective over {n} ranks")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n * size_bytes
    if op in ("reduce_scatter", "all_gather"):
        return (n - 1) / n * size_bytes
    raise ValueError(f"no ring formula for {op}")


# ----------------------------------------------------------------------------- FLOPs / MFU
def gpt_flops_per_step(batch, seq, layers, hidden, vocab):
    """Megatron's model FLOPs of one plain-GPT step (fwd + bwd; causal attention halved, no recompute)."""
    return 72.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (12.0 * hidden) + vocab / (12.0 * layers * hidden))


def mfu(flops_per_step, step_seconds, peak_flops_per_rank, ranks=1):
    if step_seconds <= 0 or peak_flops_per_rank <= 0 or ranks < 1:
        raise ValueError("mfu: step time, peak and ranks must be positive")
    return flops_per_step / (step_seconds * peak_flops_per_rank * ranks)


def recompute_flops(mode, batch, seq, layers, hidden):
    """Forward FLOPs per step that recompute adds to a plain-GPT step (causal attention halved, as Megatron counts):
    full: every layer's forward again, 24 B s L h^2 (1 + s/(12h)) (so model + full = Megatron's 96 B s L h^2 (1 +
    s/(12h) + V/(16 L h))); selective (core_attn): QK^T and AV again, 2 B s^2 h L; none: 0."""
    if mode == "full":
        return 24.0 * batch * seq * layers * hidden ** 2 * (1 + seq / (12.0 * hidden))
    if mode == "selective":
        return 2.0 * batch * seq * seq * hidden * layers
    if mode == "none":
        return 0.0
    raise ValueError(f"recompute mode {mode!r}: full, selective or none")


# ----------------------------------------------------------------------------- timeline intervals
def union(intervals):
    """Merged, sorted [(start, end)] of possibly overlapping intervals."""
    out = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def length(intervals):
    return sum(e - s for s, e in union(intervals))


def intersection_length(a, b):
    """|union(a) ∩ union(b)|."""
    ua, ub, i, j, tot = union(a), union(b), 0, 0, 0.0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        tot += max(0.0, hi - lo)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return tot


def exposed_comm(comm, compute):
    """Communication time not hidden under compute: |comm| - |comm ∩ compute|."""
    return length(comm) - intersection_length(comm, compute)


def stage_times(trace, skip_steps=1):
    """Per rank (pid) of a `mcpp train --timeline` trace: the compute time per step, ms — |union(forward ∪
    backward)| over the steps after the first skip_steps (warm-up), divided by their number — and the decoder
    layers it ran (its "layer" rows "decoder.layers.<i>", E06).
    Returns {pid: {"busy_ms": x, "layers": [i, ..]}}."""
    evs = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = sorted({e["args"]["step"] for e in evs if e.get("cat") in ("forward", "backward")})
    kept = set(steps[skip_steps:] if len(steps) > skip_steps else steps)
    out = {}
    for e in evs:
        r = out.setdefault(e["pid"], {"spans": [], "layers": set()})
        if e.get("cat") in ("forward", "backward") and e["args"]["step"] in kept:
            r["spans"].append((e["ts"], e["ts"] + e["dur"]))
        elif e.get("cat") == "layer" and e["name"].startswith("decoder.layers."):
            r["layers"].add(int(e["name"].rsplit(".", 1)[1]))
    return {pid: {"busy_ms": length(r["spans"]) / 1e3 / max(1, len(kept)), "layers": sorted(r["layers"])}
            for pid, r in sorted(out.items())}


# ----------------------------------------------------------------------------- MoE / IO
def load_stats(tokens_per_expert):
    """min, max, coefficient of variation (std / mean) and max / mean of an expert load vector."""
    n = len(tokens_per_expert)
    mean = sum(tokens_per_expert) / n
    var = sum((t - mean) ** 2 for t in tokens_per_expert) / n
    return {"min": min(tokens_per_expert), "max": max(tokens_per_expert),
            "cv": math.sqrt(var) / mean if mean else 0.0, "max_over_mean": max(tokens_per_expert) / mean if mean else 0.0}


def expert_capacity(tokens, topk, experts, factor):
    """Megatron's get_capacity(num_tokens * topk, num_experts, capacity_factor): ceil(n k / E x factor) routes an
    expert keeps of a rank's n tokens."""
    if tokens < 1 or topk < 1 or experts < 1 or factor <= 0:
        raise ValueError(f"capacity: tokens {tokens}, topk {topk}, experts {experts}, factor {factor}")
    return math.ceil(tokens * topk / experts * factor)


def dropped_fraction(tokens_per_expert, capacity):
    """The share of routes a capacity drops: sum_e max(0, T_e - C) / sum_e T_e (0 for no routes)."""
    total = sum(tokens_per_expert)
    return sum(max(0, t - capacity) for t in tokens_per_expert) / total if total else 0.0


def switch_aux_loss_bounds(tokens_per_expert, tokens, topk):
    """Bounds of Megatron's switch load-balancing loss divided by its coefficient (the logged value):
    E / (N^2 k) sum_e P_e T_e, P_e = the softmax scores' sum over the N tokens (sum_e P_e = N), T_e the routes; so
    it lies in [E min T / (N k), E max T / (N k)] and is 1 when the load is perfectly even."""
    e = len(tokens_per_expert)
    if tokens < 1 or topk < 1 or e < 1:
        raise ValueError(f"aux loss bounds: tokens {tokens}, topk {topk}, experts {e}")
    return e * min(tokens_per_expert) / (tokens * topk), e * max(tokens_per_expert) / (tokens * topk)


def throughput_mb_s(nbytes, ms):
    if ms <= 0:
        raise ValueError("throughput: non-positive time")
    return nbytes / 1e6 / (ms / 1e3)
