"""ctest experiments.gpu_commands: the gpu / gpu-multi tiers' real-shape `mcpp train` commands of E04, E09, E10 and E12,
built by the recipes' own builders, each validated by `mcpp plan memory --world N --json` (it parses and validates the
whole training config: flags, shapes, the parallel layout) and planned to fit one H100 (80 GiB per rank, the plan
being a lower bound of the device peak). The --smoke tests run the same code at small shapes; this checks the shapes
the device will get, which the CPU cannot run.
usage: gpu_commands_check.py MCPP"""
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "experiments", "lib"))
import runner  # noqa: E402

MCPP = sys.argv[1]
H100_BYTES = 80 * 2 ** 30
E04, E09, E10, E12 = (runner.find_recipe(e) for e in ("E04", "E09", "E10", "E12"))


def commands():
    """(label, train argv without 'train', world size) of every real-shape gpu / gpu-multi run."""
    s = E04.TIERS["gpu"]
    for q in s["seqs"]:
        for m, f in E04.MODES_TP1.items():
            yield f"E04 gpu s{q} {m}", E04.model(s, q) + f, 1
    s = E04.TIERS["gpu-multi"]
    for q in s["seqs"]:
        for m, f in E04.MODES.items():
            yield f"E04 gpu-multi s{q} {m}", E04.model(s, q) + f, s["gpus"]
    s = E09.TIERS["gpu"]
    yield "E09 gpu attention fp32", E09.check_model(s) + s["device"], 1
    yield "E09 gpu attention bf16", E09.check_model(s) + s["device"] + s["bf16"], 1
    w = s["sweep"]
    for q in w["seqs"]:
        yield f"E09 gpu sweep s{q}", E09.gpt(w, q, w["tokens"] // q, w["iters"], w["log"]) + s["device"] + s["bf16"], 1
    s = E09.TIERS["gpu-multi"]
    for name, (n, kind) in E09.RUNS.items():
        yield f"E09 gpu-multi {name}", E09.model(s) + ["--context-parallel-size", str(n), "--cp-comm-type", kind], n
    s = E10.TIERS["gpu"]
    for name, f in E10.RUNS_EP1.items():
        yield f"E10 gpu {name}", E10.model(s) + ["--moe-per-layer-logging", *f], 1
    s = E10.TIERS["gpu-multi"]
    for ep in s["eps"]:
        yield f"E10 gpu-multi ep{ep}", E10.model(s) + ["--expert-model-parallel-size", str(ep)], E10.RANKS
    s = E12.TIERS["gpu"]
    m = [a for a in E12.model_one(s, "/nonexistent/data") if a != "train"]
    for spec in ("kill@3", "slow-data:ms=400@2", *E12.NAN_SPECS, f"bad-shard@{s['iters']}"):
        yield f"E12 gpu {spec}", m + ["--inject-fault", spec, "--save", "/nonexistent/ck"], 1
    s = E12.TIERS["gpu-multi"]
    m = [a for a in E12.model(s) if a != "train"]
    for spec in ("hang@3:1", "wrong-collective@3:1"):
        yield f"E12 gpu-multi {spec}", m + ["--inject-fault", spec, "--check-collectives"], s["gpus"]


failures, n = [], 0
for label, argv, world in commands():
    n += 1
    p = subprocess.run([MCPP, "plan", "memory", "--world", str(world), "--json", *argv], capture_output=True, text=True)
    if p.returncode != 0:
        failures.append(f"{label}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
        continue
    peak = max(st["total_bytes"] for st in json.loads(p.stdout)["stages"])
    if peak > H100_BYTES:
        failures.append(f"{label}: planned {peak / 2 ** 30:.1f} GiB per rank > 80 GiB")
if failures:
    sys.exit("\n".join(failures))
print(f"{n} real-shape gpu / gpu-multi commands validated by `mcpp plan memory`, each planned under 80 GiB per rank")
