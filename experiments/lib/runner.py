"""The experiment runner (issue 34, items 1 and 3): runs one recipe's repeats and writes its evidence.

`experiments/run EXX [--tier cpu|gpu|gpu-multi] [--repeats 3] [--smoke]` loads experiments/EXX-*/recipe.py and writes
<results>/EXX/<date>-<commit>[-<tier>][-smoke][-broken]/:
  cmd.txt       every command line run, in order (repeat, name, argv)
  env.json      commit, dirty flag, build flags (CMakeCache), machine, CPU / GPU, driver, MPI, env vars
  rank_<r>/     every rank's stdout / stderr and per-rank metrics JSONL of every run (<repeat>-<name>.*)
  summary.json  each accepted repeat's parsed metrics, median / spread over them, rejected repeats and why
  oracle.json   the recipe's correctness checks and verdict ("pass" / "fail")
  negative.md   a setting that does not help, measured, with the reason
  report.md     the recipe's tables
A recipe module defines: ID, TITLE, TIERS {tier: settings dict, or a string = why the tier refuses},
repeat(ctx, s) -> {metric: value}, oracle(ctx, s, repeats) -> [check dicts], negative(ctx, s) -> markdown,
report(s, summary, checks) -> markdown, and broken(s) -> settings whose input is deliberately wrong (the oracle
must then fail: `--broken`).

Tiers: "cpu" (CPU ranks), "gpu" (one GPU: what one GPU can show) and "gpu-multi" (the settings that need several
GPUs). A tier's settings may name "gpus": N (and "why_gpus", the sentence saying what needs them): with fewer GPUs
visible (nvidia-smi's count, limited by CUDA_VISIBLE_DEVICES) the tier refuses with one error line, exit 2, before
anything runs. The "gpu" tier pins its one-rank runs to GPU 0; "gpu-multi" leaves the GPUs to the ranks (local rank).
--smoke (tests): a gpu / gpu-multi tier's code run on CPU ranks — its settings overlaid with the recipe's
SMOKE[tier] (small shapes, "device": [] so no --device cuda / --bf16) — so a device call does not find a recipe bug
the CPU could have shown. Checks made with device_only=True (device memory, MFU) are recorded "n/a" in a smoke run
and left out of its verdict; everything else (the same commands, parsers and oracle code) must pass.

Environment-clean check (before and after each repeat): no process left that carries this run's tag
(MCPP_EXPERIMENT_TAG in its environment: our mcpp / mpiexec / orted children), no staging directory
(*.tmp-*) left under the work directory, and on the gpu tier no compute process on the GPU and its memory
back to the level measured at start (+256 MiB). A dirty repeat is rejected (recorded) and retried, at most
twice per repeat; the run fails when fewer than --repeats repeats are clean.
"""
import datetime
import glob
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments", "lib"))
import formulas  # noqa: E402

TAG_VAR = "MCPP_EXPERIMENT_TAG"


class RunFailed(Exception):
    pass


def find_recipe(exp_id):
    hits = sorted(glob.glob(os.path.join(ROOT, "experiments", exp_id + "-*", "recipe.py")))
    if not hits:
        known = sorted(os.path.basename(os.path.dirname(p)) for p in
                       glob.glob(os.path.join(ROOT, "experiments", "E*-*", "recipe.py")))
        print(f"error: no recipe for experiment '{exp_id}' (have: {', '.join(known)})", file=sys.stderr)
        sys.exit(2)
    spec = importlib.util.spec_from_file_location("recipe_" + exp_id, hits[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.DIR = os.path.dirname(hits[0])
    return mod


def binary_commit(mcpp):
    """The commit the mcpp binary was built from (`mcpp --version`'s "git commit:" line), "" if unknown."""
    try:
        p = subprocess.run([mcpp, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return ""
    return next((l.split(":", 1)[1].strip() for l in p.stdout.splitlines() if l.startswith("git commit:")), "")


def git(*args):
    p = subprocess.run(["git", "--no-optional-locks", "-C", ROOT, *args], capture_output=True, text=True)  # no index lock
    return p.stdout.strip() if p.returncode == 0 else ""


# ----------------------------------------------------------------------------- environment
def tagged_processes(tag):
    """pids (other than ours) whose environment carries TAG_VAR=tag."""
    needle = f"{TAG_VAR}={tag}".encode()
    out = []
    for d in glob.glob("/proc/[0-9]*"):
        pid = int(os.path.basename(d))
        if pid == os.getpid():
            continue
        try:
            with open(os.path.join(d, "environ"), "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(os.path.join(d, "cmdline"), "rb") as c:
                        out.append((pid, c.read().replace(b"\0", b" ").decode(errors="replace")[:120]))
        except OSError:
            continue
    return out


def gpu_state(count=1):
    """([memory used MiB of GPUs 0..count-1], [compute process pids on them]) or None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    used, apps = [], []
    for i in range(count):
        q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", str(i)],
                           capture_output=True, text=True)
        a = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader", "-i", str(i)],
                           capture_output=True, text=True)
        if q.returncode != 0:
            return None
        used.append(int(q.stdout.split()[0]))
        apps += [l.strip() for l in a.stdout.splitlines() if l.strip()]
    return used, apps


def visible_gpus():
    """The GPUs a run may use: nvidia-smi's count, limited by CUDA_VISIBLE_DEVICES (its entries up to the first
    invalid one, as CUDA reads it); 0 without a working nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return 0
    q = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True)
    if q.returncode != 0:
        return 0
    n = len([l for l in q.stdout.splitlines() if l.strip()])
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ok = 0
        for x in cvd.split(","):
            x = x.strip()
            if not x or x.startswith("-"):
                break
            ok += 1
        n = min(n, ok)
    return n


def clean_check(tag, work, tier, gpu_idle_mib, gpus=1):
    """[problem strings]; empty when the environment is clean. tier "gpu" / "gpu-multi": GPUs 0..gpus-1 must hold no
    compute process and their memory must be back to gpu_idle_mib ([MiB per GPU]) + 256."""
    problems = [f"stray process {pid}: {cmd}" for pid, cmd in tagged_processes(tag)]
    problems += [f"leftover staging directory {p}" for p in
                 glob.glob(os.path.join(work, "**", "*.tmp-*"), recursive=True)]
    if tier in ("gpu", "gpu-multi"):
        st = gpu_state(gpus)
        if st is None:
            problems.append(f"{tier} tier without a working nvidia-smi")
        else:
            used, apps = st
            if apps:
                problems.append(f"compute processes on GPUs 0..{gpus - 1}: {apps}")
            for i, u in enumerate(used):
                if gpu_idle_mib is not None and u > gpu_idle_mib[i] + 256:
                    problems.append(f"GPU {i} memory {u} MiB, idle level {gpu_idle_mib[i]} MiB")
    return problems


def env_json(mcpp, tier):
    cache = {}
    for build in (os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(mcpp))), "CMakeCache.txt"),):
        if os.path.exists(build):
            for line in open(build, errors="replace"):
                k = line.split(":", 1)[0]
                if k in ("CMAKE_BUILD_TYPE", "MCPP_CUDA", "MCPP_BENCH", "CMAKE_CXX_COMPILER", "CMAKE_CUDA_ARCHITECTURES"):
                    cache[k] = line.strip().split("=", 1)[-1]
    cpu = ""
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    mpi = subprocess.run([mpi_launcher()[0], "--version"], capture_output=True, text=True)
    return {
        "commit": git("rev-parse", "HEAD") or binary_commit(mcpp), "binary_commit": binary_commit(mcpp), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "tier": tier, "mcpp": os.path.abspath(mcpp), "build": cache, "machine": platform.node(),
        "platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
        "gpu": smi.stdout.strip() if smi and smi.returncode == 0 else None,
        "mpi": (mpi.stdout or mpi.stderr).splitlines()[0] if (mpi.stdout or mpi.stderr) else None,
        "python": sys.version.split()[0], "loadavg_1_5_15": list(os.getloadavg()),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "CUDA_", "NCCL_", "OMPI_MCA", "MCPP"))},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def mpi_launcher():
    """$MPIRUN (bench/gpu/env.sh on the device) or mpiexec, as root, oversubscribed."""
    m = os.environ.get("MPIRUN")
    return m.split() if m else ["mpiexec", "--allow-run-as-root", "--oversubscribe"]


# ----------------------------------------------------------------------------- the context a recipe sees
class Context:
    def __init__(self, recipe, tier, mcpp, out, work, tag, smoke=False):
        self.recipe, self.tier, self.mcpp, self.out, self.work, self.tag = recipe, tier, mcpp, out, work, tag
        self.smoke = smoke
        self.one_gpu = tier == "gpu" and not smoke  # one-rank runs pinned to GPU 0
        self.rep = "setup"
        self.env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", TAG_VAR: tag}

    def path(self, *parts):
        p = os.path.join(self.work, self.rep, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def mcpp_run(self, name, argv, np_=1, expect_ok=True, metrics=True, timeout=300, env=None):
        """Runs `mcpp <argv>` (under the MPI launcher when np_ > 1), --metrics-path <work>/<rep>/<name>/metrics.jsonl
        added for `train` when metrics; copies every rank's stdout / stderr / metrics file to rank_<r>/.
        Returns (returncode, {rank: stdout}, run dir)."""
        rundir = self.path(name, "x")[:-2]
        argv = list(argv)
        if metrics and argv and argv[0] == "train":
            argv += ["--metrics-path", os.path.join(rundir, "metrics.jsonl")]
        cmd = [self.mcpp, *argv]
        logdir = os.path.join(rundir, "mpi_logs")
        if np_ > 1:
            cmd = mpi_launcher() + ["-np", str(np_), "--output-filename", logdir] + cmd
        run_env = {**self.env, **(env or {})}
        if self.one_gpu and np_ == 1:  # per call: a gpu-multi run (or a launcher's ranks) must see every GPU
            run_env.setdefault("CUDA_VISIBLE_DEVICES", "0")
        with open(os.path.join(self.out, "cmd.txt"), "a") as f:
            f.write(f"[{self.rep}] {name}: {' '.join(f'{k}={v}' for k, v in (env or {}).items())}"
                    f"{' ' if env else ''}{' '.join(cmd)}\n")
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, env=run_env, timeout=timeout, cwd=rundir)
        wall = time.time() - t0
        outs, errs = {}, {}
        if np_ > 1:
            for r in range(np_):
                rd = os.path.join(logdir, "1", f"rank.{r}")
                outs[r] = open(os.path.join(rd, "stdout"), errors="replace").read() if os.path.exists(
                    os.path.join(rd, "stdout")) else ""
                err = open(os.path.join(rd, "stderr"), errors="replace").read() if os.path.exists(
                    os.path.join(rd, "stderr")) else ""
                self._keep(r, name, outs[r], err, rundir)
                errs[r] = err
        else:
            outs[0] = p.stdout
            self._keep(0, name, p.stdout, p.stderr, rundir)
        self.last_stderr = p.stderr + "".join(errs.values())  # the launcher's and every rank's
        if expect_ok and p.returncode != 0:
            tail = "\n".join(((p.stdout or "") + (p.stderr or "") + "".join(outs.values())).splitlines()[-15:])
            raise RunFailed(f"{name}: exit {p.returncode} ({' '.join(cmd[:8])} ...)\n{tail}")
        self.last_wall_s = wall
        return p.returncode, outs, rundir

    def _keep(self, r, name, out, err, rundir):
        d = os.path.join(self.out, f"rank_{r}")
        os.makedirs(d, exist_ok=True)
        stem = f"{self.rep}-{name}"
        with open(os.path.join(d, stem + ".log"), "w") as f:
            f.write(out)
        if err:
            with open(os.path.join(d, stem + ".err"), "w") as f:
                f.write(err)
        for m in (os.path.join(rundir, f"metrics.rank_{r}.jsonl"),):
            if os.path.exists(m):
                shutil.copy(m, os.path.join(d, stem + ".metrics.jsonl"))

    def mcpp_timed(self, name, argv, env=None, poll=None, timeout=300):
        """Runs one `mcpp <argv>` process (e.g. `launch`, whose ranks it starts) with each stderr line timestamped
        as it arrives (the launcher's lines are unbuffered) and poll() called every ~5 ms while it runs (a recipe
        watching a file). stdout / stderr kept in rank_0/ like mcpp_run's. Returns (returncode, stdout,
        [(wall-clock seconds, stderr line)], wall seconds)."""
        import threading
        rundir = self.path(name, "x")[:-2]
        run_env = {**self.env, **(env or {})}
        if self.one_gpu:
            run_env.setdefault("CUDA_VISIBLE_DEVICES", "0")
        cmd = [self.mcpp, *argv]
        with open(os.path.join(self.out, "cmd.txt"), "a") as f:
            f.write(f"[{self.rep}] {name}: {' '.join(f'{k}={v}' for k, v in (env or {}).items())}"
                    f"{' ' if env else ''}{' '.join(cmd)}\n")
        lines, out_path = [], os.path.join(rundir, "stdout")
        t0 = time.time()
        with open(out_path, "w") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=run_env, cwd=rundir)

            def read():
                for line in p.stderr:
                    lines.append((time.time(), line.rstrip("\n")))
            th = threading.Thread(target=read, daemon=True)
            th.start()
            while p.poll() is None:
                if poll:
                    poll()
                if time.time() - t0 > timeout:
                    p.kill()
                time.sleep(0.005)
            th.join(10)
        wall = time.time() - t0
        stdout = open(out_path, errors="replace").read()
        self._keep(0, name, stdout, "\n".join(l for _, l in lines), rundir)
        self.last_stderr = "\n".join(l for _, l in lines)
        return p.returncode, stdout, lines, wall

    def keep_file(self, src, name):
        """Copies an artifact (a trace, a plan) into the results directory."""
        dst = os.path.join(self.out, "artifacts", f"{self.rep}-{name}")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(src, dst)
        return dst


def records(rundir, event, rank=None):
    """The run's metrics records of one event (the last rank's file, or rank r's per-rank file)."""
    p = os.path.join(rundir, "metrics.jsonl" if rank is None else f"metrics.rank_{rank}.jsonl")
    if not os.path.exists(p):
        return []
    return [r for r in map(json.loads, open(p)) if r.get("event") == event]


def write_data(prefix, vocab, tokens=40000, seed=1, doc_len=(64, 256)):
    """Random token ids (a linear congruential stream, stdlib only) as a Megatron MMIDIDX int32 dataset."""
    import array
    import struct
    x, docs, n = seed, [], 0
    while n < tokens:
        x = (1103515245 * x + 12345) % 2 ** 31
        ln = doc_len[0] + x % (doc_len[1] - doc_len[0])
        d = array.array("i")
        for _ in range(ln):
            x = (1103515245 * x + 12345) % 2 ** 31
            d.append((x >> 8) % (vocab - 1))
        docs.append(d)
        n += ln
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            d.tofile(f)
    sizes = array.array("i", [len(d) for d in docs])
    ptr, acc = array.array("q"), 0
    for d in docs:
        ptr.append(acc)
        acc += 4 * len(d)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, len(docs), len(docs) + 1))
        sizes.tofile(f)
        ptr.tofile(f)
        array.array("q", range(len(docs) + 1)).tofile(f)
    return prefix


# ----------------------------------------------------------------------------- one experiment
def refuse(exp_id, tier, why):
    print(f"error: experiment {exp_id} --tier {tier} refused: {why}", file=sys.stderr)
    return 2, None


def run_experiment(exp_id, tier="cpu", repeats=3, mcpp=None, results=None, broken=False, keep_work=False,
                   smoke=False):
    """Runs the recipe; returns (exit code, results dir). Exit 0: oracle passed; 1: oracle failed or a run failed;
    2: bad usage (a refused tier, too few GPUs, a missing binary)."""
    recipe = find_recipe(exp_id)
    settings = recipe.TIERS.get(tier)
    if settings is None:
        print(f"error: experiment {exp_id} has no '{tier}' tier (tiers: {', '.join(recipe.TIERS)})", file=sys.stderr)
        return 2, None
    if isinstance(settings, str):
        return refuse(exp_id, tier, settings)
    if callable(settings):  # a tier that checks the machine first (e.g. the GPU count)
        settings = settings()
        if isinstance(settings, str):
            return refuse(exp_id, tier, settings)
    if smoke:
        sm = getattr(recipe, "SMOKE", {}).get(tier)
        if tier == "cpu" or sm is None:
            print(f"error: --smoke runs a gpu tier's code on CPU ranks; experiment {exp_id} has no smoke shapes for "
                  f"'{tier}' (has: {', '.join(getattr(recipe, 'SMOKE', {})) or 'none'})", file=sys.stderr)
            return 2, None
        settings = {**settings, **sm}
    mcpp = os.path.abspath(mcpp or os.environ.get("MCPP") or os.path.join(ROOT, "build", "bin", "mcpp"))
    if not (os.path.isfile(mcpp) and os.access(mcpp, os.X_OK)):
        print(f"error: mcpp binary '{mcpp}' is not an executable (build it, or pass --mcpp / set $MCPP)",
              file=sys.stderr)
        return 2, None
    on_gpu = tier != "cpu" and not smoke
    gpus = settings.get("gpus", 1) if on_gpu else 0
    if on_gpu and gpu_state() is None:
        print(f"error: experiment {exp_id} --tier {tier}: no GPU here (nvidia-smi does not answer)", file=sys.stderr)
        return 2, None
    if on_gpu and visible_gpus() < gpus:
        return refuse(exp_id, tier, f"needs {gpus} GPUs, {visible_gpus()} visible (nvidia-smi, CUDA_VISIBLE_DEVICES): "
                      f"{settings.get('why_gpus', 'run on a machine with that many GPUs')}")
    if broken:
        settings = recipe.broken(dict(settings))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    commit = git("rev-parse", "--short", "HEAD") or binary_commit(mcpp)[:7] or "nogit"  # a device copy has no .git
    out = os.path.join(results or os.path.join(ROOT, "experiments", "results"), exp_id,
                       f"{stamp}-{commit}{'-' + tier if tier != 'cpu' else ''}{'-smoke' if smoke else ''}"
                       f"{'-broken' if broken else ''}")
    os.makedirs(out)
    work = tempfile.mkdtemp(prefix=f"mcpp-{exp_id}-")
    tag = uuid.uuid4().hex
    ctx = Context(recipe, tier, mcpp, out, work, tag, smoke)
    with open(os.path.join(out, "env.json"), "w") as f:
        json.dump({**env_json(mcpp, tier), "smoke": smoke}, f, indent=1)
    env_tier = tier if on_gpu else "cpu"  # what the clean check inspects
    st = gpu_state(gpus) if on_gpu else None
    gpu_idle = st[0] if st else None
    accepted, rejected, rc = [], [], 0
    try:
        if hasattr(recipe, "setup"):
            recipe.setup(ctx, settings)
        attempt = 0
        while len(accepted) < repeats and attempt < repeats + 2:
            ctx.rep = f"r{attempt}"
            attempt += 1
            before = clean_check(tag, work, env_tier, gpu_idle, gpus)
            metrics = recipe.repeat(ctx, settings)
            after = clean_check(tag, work, env_tier, gpu_idle, gpus)
            if before or after:
                rejected.append({"repeat": ctx.rep, "before": before, "after": after})
                print(f"{exp_id} {ctx.rep}: environment not clean, repeat rejected: {before + after}", file=sys.stderr)
                continue
            metrics["repeat"] = ctx.rep
            accepted.append(metrics)
        if len(accepted) < repeats:
            raise RunFailed(f"only {len(accepted)} of {repeats} repeats ran in a clean environment: {rejected}")
        ctx.rep, ctx.repeats = "oracle", accepted
        checks = recipe.oracle(ctx, settings, accepted)
        ctx.rep = "negative"
        neg = recipe.negative(ctx, settings)
    except RunFailed as e:
        checks, neg, rc = [{"name": "runs", "pass": False, "detail": str(e)}], "not reached: a run failed\n", 1
        print(f"{exp_id}: {e}", file=sys.stderr)
    finally:
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    if smoke:  # device memory / MFU checks mean nothing on CPU ranks: recorded, not judged
        for c in checks:
            if c.get("device_only"):
                c["pass"], c["detail"] = None, f"n/a in a CPU smoke run ({c.get('detail', '')})"
    judged = [c for c in checks if c["pass"] is not None]
    verdict = "pass" if judged and all(c["pass"] for c in judged) else "fail"
    summary = {"id": exp_id, "title": recipe.TITLE, "tier": tier, "smoke": smoke, "settings": settings,
               "broken": broken, "repeats": accepted, "rejected": rejected,
               "stats": formulas.summarize_repeats(accepted) if accepted else {}}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump({"verdict": verdict, "checks": checks}, f, indent=1)
    with open(os.path.join(out, "negative.md"), "w") as f:
        f.write(neg)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(f"# {exp_id}: {recipe.TITLE} ({tier} tier{', CPU smoke run' if smoke else ''}"
                f"{', BROKEN input' if broken else ''})\n\n")
        f.write(f"Commit {commit}, {len(accepted)} clean repeats ({len(rejected)} rejected). Oracle: **{verdict}**.\n\n")
        if accepted and rc == 0:
            f.write(recipe.report(settings, summary, checks))
        f.write("\n## Oracle\n\n| check | pass | detail |\n|---|---|---|\n")
        for c in checks:
            mark = "n/a" if c["pass"] is None else "yes" if c["pass"] else "**no**"
            f.write(f"| {c['name']} | {mark} | {str(c.get('detail', '')).replace('|', '/')[:300]} |\n")
        f.write("\n## Negative result\n\n" + neg)
    print(f"{exp_id} ({tier}{', smoke' if smoke else ''}{', broken' if broken else ''}): oracle {verdict}; "
          f"results in {out}")
    return (0 if verdict == "pass" else 1), out


def stats_table(summary, keys, fmt="{:.4g}"):
    """Markdown rows 'metric | median | min | max | rel spread' for keys of summary['stats']."""
    rows = ["| metric | median | min | max | rel. spread |", "|---|---:|---:|---:|---:|"]
    for k in keys:
        s = summary["stats"].get(k)
        if s:
            rows.append(f"| {k} | {fmt.format(s['median'])} | {fmt.format(s['min'])} | {fmt.format(s['max'])} | "
                        f"{s['rel_spread']:.3f} |")
    return "\n".join(rows) + "\n"


def check(name, ok, detail="", device_only=False):
    """One oracle check. device_only: it holds on a GPU only (device memory, MFU): "n/a" in a CPU smoke run."""
    c = {"name": name, "pass": bool(ok), "detail": detail}
    if device_only:
        c["device_only"] = True
    return c
