"""training.observability_cli: per-rank metrics, Megatron's timers, TFLOP/s and MFU, the straggler report, TensorBoard
events, provenance, the MoE load report, the module trace, `mcpp metrics plot|summarize` (docs/OBSERVABILITY.md).

A. np 4 (PP2 x DP2), --timing-log-level 2 --log-straggler --tensorboard-dir ... --trace-modules 2 --peak-tflops 1:
   every rank writes metrics.rank_<r>.jsonl (provenance first; per iteration its step time, timers >= 0 whose
   top-level phases sum to at most the step time and whose parts sum to at most their phase, memory, tokens); the
   last rank's records carry TFLOP/s/GPU equal to Megatron's formula (written out here) over the logged step time and
   world size, MFU = that / the peak, the min / max over ranks equal to the rank files'; the log line shows them, the
   timer report and the straggler report; the TensorBoard event file, read with an independent CRC-32C and protobuf
   decoder, holds valid framing and scalars equal to the JSONL values; the checkpoint manifest carries provenance;
   the module trace names each stage's modules with the config's shapes.
B. 1 rank MoE (4 experts, top 2, capacity factor 0.5, --moe-per-layer-logging): tokens per expert sum to the routes,
   at least half dropped, cv and entropy consistent; plot (PNG) and summarize of A and B.
C. bad input: an unwritable --tensorboard-dir / --metrics-path, --timing-log-level 3, a missing run: one error each.
"""
import glob
import json
import math
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from cli_harness import MCPP, WORK, failures, record_corpus, run, tiny_train_flags  # noqa: E402


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


def jsonl(path):
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []


# ---- an independent TFRecord / Event reader: bitwise CRC-32C (reflected 0x82F63B78) and a protobuf walk
def crc32c(data):
    c = 0xFFFFFFFF
    for byte in data:
        c ^= byte
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    return c ^ 0xFFFFFFFF


def masked(c):
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def fields(buf):
    """(field number, wire type, value) of a protobuf message: ints for varint / fixed, bytes for length-delimited."""
    i, out = 0, []
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        out.append((num, wire, v))
    return out


def varint(buf, i):
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def read_events(path):
    """[(step, tag, value)] and the file_version of a TensorBoard event file; framing errors recorded."""
    data = open(path, "rb").read()
    i, scalars, version = 0, [], None
    while i < len(data):
        (n,) = struct.unpack_from("<Q", data, i)
        (len_crc,) = struct.unpack_from("<I", data, i + 8)
        check(len_crc == masked(crc32c(data[i:i + 8])), f"tensorboard: length CRC at byte {i}")
        rec = data[i + 12:i + 12 + n]
        (data_crc,) = struct.unpack_from("<I", data, i + 12 + n)
        check(data_crc == masked(crc32c(rec)), f"tensorboard: data CRC at byte {i}")
        i += 12 + n + 4
        step = 0
        for num, wire, v in fields(rec):
            if num == 2:
                step = v
            elif num == 3:
                version = v.decode()
            elif num == 5:
                for vn, _, value in fields(v):
                    if vn != 1:
                        continue
                    tag, x = None, None
                    for fn, _, fv in fields(value):
                        if fn == 1:
                            tag = fv.decode()
                        elif fn == 2:
                            (x,) = struct.unpack("<f", fv)
                    scalars.append((step, tag, x))
    return scalars, version


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


data = record_corpus()
# ------------------------------------------------------------------------------------------------------------- A
A = os.path.join(WORK, "a")
TB = os.path.join(WORK, "tb")
pa = run([MCPP, "train", *tiny_train_flags(data), "--pipeline-model-parallel-size", "2", "--save", A,
          "--timing-log-level", "2", "--log-straggler", "--straggler-threshold", "0", "--tensorboard-dir", TB,
          "--log-timers-to-tensorboard", "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard",
          "--trace-modules", "2", "--peak-tflops", "1"], np_=4)
main = jsonl(os.path.join(A, "metrics.jsonl"))
train = [r for r in main if r.get("event") == "train"]
check(main and main[0].get("event") == "provenance", f"A: the metrics file does not open with provenance: {main[:1]}")
if main and main[0].get("event") == "provenance":
    p = main[0]["provenance"]
    check(re.fullmatch(r"[0-9a-f]{40}|unknown", p["git_commit"]) is not None and "train" in p["argv"]
          and p["version"] and p["build_type"], f"A: provenance {p}")
check(len(train) == 6, f"A: expected 6 train records, got {len(train)}")
# Megatron's num_floating_point_operations for the tiny GPT (plain: MHA, GELU 4h, tied), written out:
# 3 passes x 2 x per token [L (h*3h + h*h + 2*h*4h) + s*h (causal QK^T and AV: 2 * h * s / 2) per layer + h*V]
# (V: GPT-2's 50257 tokens padded to a multiple of 128)
L, H, S, V, GBS, WORLD = 2, 32, 16, 50304, 8, 4
per_token = 6 * (L * (3 * H * H + H * H + 8 * H * H) + L * S * H + H * V)
for r in train:
    want = per_token * GBS * S / (r["elapsed_ms_per_iter"] / 1000 * 1e12 * WORLD)
    check(abs(r["tflops_per_gpu"] - want) <= 1e-9 * want, f"A: TFLOP/s/GPU {r['tflops_per_gpu']} vs {want}")
    check(abs(r.get("mfu", -1) - r["tflops_per_gpu"] / 1.0) <= 1e-12, f"A: MFU {r.get('mfu')} (peak 1 TFLOP/s)")
    check(r.get("peak_tflops") == 1.0, f"A: peak_tflops {r.get('peak_tflops')}")
line = [l for l in pa.stdout.splitlines() if "iteration        3/" in l]
check(line and "throughput per GPU (TFLOP/s/GPU):" in line[0] and "MFU:" in line[0]
      and "step time min/max over ranks (ms):" in line[0], f"A: log line {line}")
for words in ("(min, max) time across ranks (ms):", "forward-backward ...", "forward-compute ...",
              "backward-compute ...", "optimizer ...", "batch-generator ...", "straggler report | slowest: rank",
              "straggler: rank", "module trace of iteration 2"):
    check(words in pa.stdout, f"A: stdout lacks {words!r}")
check(any(w in pa.stdout for w in ("forward-send ...", "forward-recv ...", "forward-send-backward-recv ...",
                                   "backward-send-forward-recv ...")), "A: no P2P timer in the timer report")
# every rank's file
TOP = ["forward-backward", "layernorm-grads-all-reduce", "embedding-grads-all-reduce", "optimizer"]
FB_PARTS = ["forward-compute", "backward-compute", "all-grads-sync", "forward-recv", "forward-send",
            "backward-recv", "backward-send", "forward-send-forward-recv", "forward-send-backward-recv",
            "backward-send-forward-recv", "backward-send-backward-recv", "forward-backward-send-forward-backward-recv"]
OPT_PARTS = ["optimizer-clip-main-grad", "optimizer-inner-step"]
per_rank = {}
for rank in range(4):
    recs = jsonl(os.path.join(A, f"metrics.rank_{rank}.jsonl"))
    check(recs and recs[0].get("event") == "provenance" and recs[0].get("rank") == rank,
          f"A rank {rank}: no provenance record first")
    tr = [r for r in recs if r.get("event") == "train"]
    per_rank[rank] = {r["iteration"]: r for r in tr}
    if not check(len(tr) == 6, f"A rank {rank}: {len(tr)} train records"):
        continue
    for r in tr:
        t, step = r["timers_ms"], r["step_ms_mean"]
        check(r["iterations"] == 1 and len(r["step_ms"]) == 1 and step > 0, f"A rank {rank}: steps {r['step_ms']}")
        check(all(v >= 0 for v in t.values()), f"A rank {rank}: a negative timer {t}")
        for name in ("forward-backward", "optimizer", "forward-compute", "backward-compute", "batch-generator",
                     "optimizer-clip-main-grad", "optimizer-inner-step"):
            check(name in t, f"A rank {rank} it {r['iteration']}: timer {name} missing: {sorted(t)}")
        # nested host intervals: the parts of an interval sum to at most it (1e-6 ms: double sums of ns counts)
        check(sum(t.get(n, 0) for n in TOP) <= step + 1e-6, f"A rank {rank}: phases {t} exceed the step {step}")
        check(sum(t.get(n, 0) for n in FB_PARTS) <= t["forward-backward"] + 1e-6,
              f"A rank {rank}: forward-backward's parts {t}")
        check(t["batch-generator"] <= t["forward-compute"] + 1e-6, f"A rank {rank}: batch-generator {t}")  # inside it
        check(sum(t.get(n, 0) for n in OPT_PARTS) <= t["optimizer"] + 1e-6, f"A rank {rank}: optimizer's parts {t}")
        m = r["memory"]
        check(m["kind"] == "host" and 0 < m["allocated_bytes"] <= m["peak_bytes"], f"A rank {rank}: memory {m}")
        check(r["tokens"] == GBS * S, f"A rank {rank}: tokens {r['tokens']}")
for r in train:
    it = r["iteration"]
    means = [per_rank[k][it]["step_ms_mean"] for k in range(4) if it in per_rank.get(k, {})]
    if len(means) == 4:  # the gather moves float32 values
        check(abs(r["step_ms_min_over_ranks"] - min(means)) <= 1e-6 * min(means) + 1e-9
              and abs(r["step_ms_max_over_ranks"] - max(means)) <= 1e-6 * max(means) + 1e-9,
              f"A it {it}: min/max over ranks {r.get('step_ms_min_over_ranks')}/{r.get('step_ms_max_over_ranks')} "
              f"vs {means}")
        timers_max = r.get("timers_ms", {}).get("forward-backward", {}).get("max")
        fb = [per_rank[k][it]["timers_ms"]["forward-backward"] for k in range(4)]
        check(timers_max is not None and abs(timers_max - max(fb)) <= 1e-6 * max(fb), f"A it {it}: timers {fb}")
# TensorBoard: framing, then the scalars against the JSONL
events = glob.glob(os.path.join(TB, "events.out.tfevents.*"))
if check(len(events) == 1, f"A: event files {events}"):
    scalars, version = read_events(events[0])
    check(version == "brain.Event:2", f"tensorboard: file_version {version}")
    tb = {}
    for step, tag, x in scalars:  # the first event of a tag at a step (the end-of-training validation repeats one)
        tb.setdefault(tag, {}).setdefault(step, x)
    byit = {r["iteration"]: r for r in train}
    for tag, key, scale in (("lm loss", "lm_loss", 1), ("learning-rate", "learning_rate", 1),
                            ("grad-norm", "grad_norm", 1), ("batch-size", "global_batch_size", 1),
                            ("throughput", "tflops_per_gpu", 1), ("iteration-time", "elapsed_ms_per_iter", 1e-3)):
        got = tb.get(tag, {})
        check(sorted(got) == list(range(1, 7)), f"tensorboard: {tag!r} steps {sorted(got)}")
        for it, x in got.items():  # TensorBoard stores float32
            check(it in byit and x == f32(byit[it][key] * scale), f"tensorboard: {tag} at {it}: {x} vs {byit.get(it)}")
    for it, x in tb.get("forward-backward-time", {}).items():
        check(x == f32(byit[it]["timers_ms"]["forward-backward"]["max"]), f"tensorboard: forward-backward-time {it}")
    check(len(tb.get("forward-backward-time", {})) == 6, "tensorboard: no forward-backward-time")
    check(len(tb.get("mem-allocated-bytes", {})) == 6, "tensorboard: no mem-allocated-bytes")
    check(len(tb.get("lm loss vs samples", {})) == 6, "tensorboard: no lm loss vs samples")
    valid = {r["iteration"]: r for r in main if r.get("event") == "valid" and not r.get("end_of_training")}
    got = tb.get("lm loss validation", {})
    check(sorted(got) == [3, 6] and all(got[i] == f32(valid[i]["lm_loss"]) for i in got),
          f"tensorboard: lm loss validation {got} vs {valid}")
    check(sorted(tb.get("lm loss validation ppl", {})) == [3, 6], "tensorboard: no validation ppl")
# checkpoint provenance
manifests = glob.glob(os.path.join(A, "**", "*.json"), recursive=True)
metas = []
for mpath in manifests:
    try:
        j = json.load(open(mpath))
    except (ValueError, OSError):
        continue
    if isinstance(j, dict) and isinstance(j.get("meta"), dict):
        metas.append(j["meta"])
check(metas and all("provenance" in m and m["provenance"].get("git_commit") for m in metas),
      f"A: checkpoint manifests without provenance ({len(metas)} found)")
# module trace: each stage's tree (PP2: ranks 0, 1 stage 0 with the embedding and layer 0; 2, 3 stage 1)
for rank in range(4):
    mt = [r for r in jsonl(os.path.join(A, f"metrics.rank_{rank}.jsonl")) if r.get("event") == "module_trace"]
    if not check(len(mt) == 1 and mt[0]["iteration"] == 2 and "forward" in mt[0], f"A rank {rank}: module trace"):
        continue
    fwd = mt[0]["forward"]
    names = [c["name"] for c in fwd["children"]]
    want = ["embedding", "decoder"] if rank < 2 else ["decoder", "output_layer", "loss"]
    check(names == want, f"A rank {rank}: module trace children {names}")
    dec = next((c for c in fwd["children"] if c["name"] == "decoder"), {"children": []})
    layer = f"decoder.layers.{0 if rank < 2 else 1}"
    lay = [c for c in dec["children"] if c["name"] == layer]
    if check(len(lay) == 1, f"A rank {rank}: no {layer} in {[c['name'] for c in dec['children']]}"):
        attn = next((c for c in lay[0]["children"] if c["name"] == "self_attention"), None)
        qkv = attn and next((c for c in attn["children"] if c["name"].endswith("linear_qkv")), None)
        check(qkv and qkv["outputs"] == [f"float32[{S}, 2, {3 * H}]"]
              and any(o["op"] == "linear_fwd" for o in qkv["ops"]), f"A rank {rank}: linear_qkv {qkv}")
# ------------------------------------------------------------------------------------------------------------- B
B = os.path.join(WORK, "b")
run([MCPP, "train", *tiny_train_flags(data), "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size",
     "48", "--moe-expert-capacity-factor", "0.5", "--moe-per-layer-logging", "--save", B])
btrain = [r for r in jsonl(os.path.join(B, "metrics.jsonl")) if r.get("event") == "train"]
check(len(btrain) == 6, f"B: {len(btrain)} train records")
for r in btrain:
    ml = r.get("moe_load")
    if not check(ml is not None and len(r.get("moe_load_layers", [])) == 2, f"B: moe load {r.get('moe_load')}"):
        continue
    t = ml["tokens_per_expert"]
    check(abs(sum(t) - GBS * S * 2 * 2) <= 1e-6 * sum(t), f"B: routes {sum(t)} != tokens x top-2 x 2 layers")
    check(ml["dropped_fraction"] >= 0.5 - 1e-9, f"B: capacity 0.5 drops at least half: {ml['dropped_fraction']}")
    check(0 < ml["router_entropy"] <= math.log(4) + 1e-5, f"B: entropy {ml['router_entropy']}")
    mean = sum(t) / len(t)
    cv = math.sqrt(sum((x - mean) ** 2 for x in t) / len(t)) / mean
    check(abs(ml["cv"] - cv) <= 1e-9 + 1e-9 * cv and ml["min"] == min(t) and ml["max"] == max(t), f"B: cv {ml}")
    for layer in r["moe_load_layers"]:
        check(abs(sum(layer["tokens_per_expert"]) - GBS * S * 2) <= 1e-6 * GBS * S * 2, f"B: layer {layer}")
png = os.path.join(WORK, "report.png")
p = run([MCPP, "metrics", "plot", B, "--output", png])
check(os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and p.stdout.strip() == png,
      f"B: plot {p.stdout!r} {p.stderr[-500:]!r}")
p = run([MCPP, "metrics", "summarize", A, os.path.join(B, "metrics.jsonl")])
check("median step (ms)" in p.stdout and "slowest rank" in p.stdout and "MFU" in p.stdout, f"summarize: {p.stdout}")
p = run([MCPP, "--version"])
check(p.stdout.startswith("mcpp ") and "git commit:" in p.stdout, f"--version: {p.stdout!r}")
# ------------------------------------------------------------------------------------------------------------- C
blocker = os.path.join(WORK, "a_file")
open(blocker, "w").close()
for name, flags, words in (("tensorboard", ["--tensorboard-dir", os.path.join(blocker, "tb")], "tensorboard_dir"),
                           ("metrics", ["--metrics-path", os.path.join(blocker, "m.jsonl")], "metrics_path"),
                           ("timing level", ["--timing-log-level", "3"], "timing_log_level")):
    p = run([MCPP, "train", *tiny_train_flags(data), *flags], expect=1)
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    check(p.returncode == 2 and len(errs) == 1 and words in errs[0] and not re.search(r"iteration\s+\d+/", p.stdout),
          f"C {name}: exit {p.returncode}, {p.stderr[-800:]!r}")
p = run([MCPP, "metrics", "summarize", os.path.join(WORK, "nope")], expect=1)
check(p.returncode == 2 and p.stderr.startswith("error: metrics: no metrics file"), f"C summarize: {p.stderr!r}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("observability checks passed")
