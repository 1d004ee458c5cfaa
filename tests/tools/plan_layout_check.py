#!/usr/bin/env python3
"""`mcpp plan layout`: the CLI of tools/layout_planner.h.

usage: plan_layout_check.py MCPP WORKDIR
  1. A costs file (JSON) whose loss head costs three decoder layers, 8 layers at PP2, m 8: the even split is
     "E,t*4|t*4,L"; the proposal moves layers off the last stage, its max stage and simulated step time are below
     the even split's (--json), the text names both rows and the flags to use; the same costs as CSV give the same
     plan; at PP4 x VPP2 the proposal is never slower than the even split.
  2. A `mcpp train --timeline` trace (PP2, CPU ranks) carries layer rows for every decoder layer, the embedding and
     the loss: the plan reads them (8 layers, num_microbatches from the trace).
  3. Bad input exits 2 with one "error: ..." line naming the problem: a missing file, a trace without layer events,
     PP larger than the layers, both / neither source, no PP, a non-integer PP, an unknown flag, malformed JSON, a
     gap in the layer indices, interleaving with microbatches the schedule refuses.
"""
import json
import os
import subprocess
import sys

MCPP, WORK = sys.argv[1], sys.argv[2]
os.makedirs(WORK, exist_ok=True)
failures = []


def run(args, timeout=120):
    return subprocess.run([MCPP, "plan", "layout", *args], capture_output=True, text=True, timeout=timeout)


def write(name, text):
    p = os.path.join(WORK, name)
    with open(p, "w") as f:
        f.write(text)
    return p


costs = {"embedding": {"forward_ms": 0.1, "backward_ms": 0.1}, "loss": {"forward_ms": 2.0, "backward_ms": 4.0},
         "layers": [{"forward_ms": 1.0, "backward_ms": 2.0}] * 8, "num_microbatches": 8}
js = write("costs.json", json.dumps(costs))
r = run(["--layer-costs", js, "--pipeline-model-parallel-size", "2", "--json"])
p = json.loads(r.stdout) if r.returncode == 0 else {}
if not p or p["even"]["layout"] != "E,t*4|t*4,L" or p["proposal"]["layers_per_stage"][1] >= 4 or \
        not p["proposal"]["step_ms"] < p["even"]["step_ms"] or not p["proposal"]["max_stage_ms"] < p["even"]["max_stage_ms"]:
    failures.append(f"json plan: {r.stdout!r} {r.stderr!r}")
else:
    # the even split's max stage: 4 layers x 3 ms + the loss 6 ms = 18 ms (per microbatch, F + B)
    if abs(p["even"]["max_stage_ms"] - 18.0) > 1e-9:
        failures.append(f"even max stage {p['even']['max_stage_ms']} != 18")
    # 1F1B with uniform per-stage costs is (m + p - 1)(F + B) at best; the even split's slow stage sets the pace
    if not p["even"]["step_ms"] >= 8 * 18.0:
        failures.append(f"even step {p['even']['step_ms']} below m x its slowest stage")
t = run(["--layer-costs", js, "--pp", "2"])
for want in ("even ", "proposal ", "flags: --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout \"" +
             (p.get("proposal", {}).get("layout", "?")) + "\"", "predicted step time"):
    if want not in t.stdout:
        failures.append(f"text output lacks {want!r}: {t.stdout!r} {t.stderr!r}")
csv = write("costs.csv", "item,forward_ms,backward_ms\nembedding,0.1,0.1\nloss,2,4\n" +
            "".join(f"decoder.layers.{i},1,2\n" for i in range(8)))
rc = run(["--layer-costs", csv, "--pp", "2", "--num-microbatches", "8", "--json"])
if rc.returncode != 0 or json.loads(rc.stdout)["proposal"] != p.get("proposal"):
    failures.append(f"csv plan differs from json: {rc.stdout!r} {rc.stderr!r}")
rv = run(["--layer-costs", js, "--pp", "4", "--vpp", "2", "--json"])
pv = json.loads(rv.stdout) if rv.returncode == 0 else {}
if not pv or len(pv["proposal"]["layers_per_stage"]) != 8 or pv["proposal"]["step_ms"] > pv["even"]["step_ms"]:
    failures.append(f"pp4 vpp2: {rv.stdout!r} {rv.stderr!r}")

# 2. a real trace (PP2 on two CPU ranks)
data = os.path.join(WORK, "tok")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "experiments", "lib"))
import runner  # noqa: E402  (write_data: a Megatron MMIDIDX dataset of random ids)
runner.write_data(data, 512, tokens=8000)
trace = os.path.join(WORK, "trace.json")
env = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
tr = subprocess.run(["mpiexec", "--oversubscribe", "-np", "2", MCPP, "train", "--num-layers", "4", "--hidden-size",
                     "32", "--num-attention-heads", "4", "--seq-length", "16", "--max-position-embeddings", "16",
                     "--tokenizer-type", "NullTokenizer", "--vocab-size", "512", "--micro-batch-size", "1",
                     "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0", "--split",
                     "100,0,0", "--data-path", data, "--pipeline-model-parallel-size", "2", "--timeline", trace],
                    capture_output=True, text=True, env=env, timeout=300, cwd=WORK)
if tr.returncode != 0:
    failures.append(f"traced run failed: {tr.stdout[-1500:]} {tr.stderr[-1500:]}")
else:
    evs = json.load(open(trace))["traceEvents"]
    names = {(e["name"], e["args"]["pass"]) for e in evs if e.get("cat") == "layer"}
    want = {(n, ps) for n in ["embedding", "output_layer", "loss"] + [f"decoder.layers.{i}" for i in range(4)]
            for ps in ("forward", "backward")}
    if not want <= names:
        failures.append(f"trace layer rows: missing {sorted(want - names)}")
    rt = run(["--timeline", trace, "--pp", "2", "--json"])
    pt = json.loads(rt.stdout) if rt.returncode == 0 else {}
    if not pt or pt["num_microbatches"] != 4 or sum(pt["proposal"]["layers_per_stage"]) != 4:
        failures.append(f"plan from the trace: {rt.stdout!r} {rt.stderr!r}")
    summ = subprocess.run([MCPP, "trace", "summarize", trace], capture_output=True, text=True, timeout=60)
    if summ.returncode != 0:
        failures.append(f"trace summarize refuses a trace with layer rows: {summ.stderr!r}")
    bare = json.load(open(trace))
    bare["traceEvents"] = [e for e in bare["traceEvents"] if e.get("cat") != "layer"]
    no_layers = write("no_layers.json", json.dumps(bare))

# 3. bad input
bad = [
    (["--layer-costs", os.path.join(WORK, "missing.json"), "--pp", "2"], "missing.json"),
    (["--layer-costs", js, "--pp", "9"], "exceed the 8 decoder layers"),
    (["--layer-costs", js, "--timeline", js, "--pp", "2"], "exactly one of"),
    (["--pp", "2"], "exactly one of"),
    (["--layer-costs", js], "--pipeline-model-parallel-size P is required"),
    (["--layer-costs", js, "--pp", "two"], "positive integer"),
    (["--layer-costs", js, "--pp", "2", "--bogus"], "unknown argument '--bogus'"),
    (["--layer-costs", write("bad.json", "{not json"), "--pp", "2"], "bad.json"),
    (["--layer-costs", write("gap.csv", "embedding,1,1\nloss,1,1\ndecoder.layers.0,1,1\ndecoder.layers.2,1,1\n"),
      "--pp", "2", "--num-microbatches", "2"], "decoder layer 1 has no forward cost"),
    (["--layer-costs", csv, "--pp", "2"], "--num-microbatches"),
    (["--layer-costs", js, "--pp", "2", "--vpp", "2", "--num-microbatches", "3"], "num_microbatches"),
]
if tr.returncode == 0:
    bad.append((["--timeline", no_layers, "--pp", "2"], "no layer events"))
for args, needle in bad:
    r = run(args)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    if r.returncode != 2 or len(lines) != 1 or not lines[0].startswith("error:") or needle not in lines[0]:
        failures.append(f"{args}: want exit 2 and one error line with {needle!r}, got {r.returncode}: {r.stderr!r}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("plan layout: json / csv / trace plans, even vs proposal, and", len(bad), "bad inputs ok")
