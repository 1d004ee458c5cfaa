"""Shared preamble of the multi-rank mcpp CLI checks (tests/oracle/cli/{parallel_train,pipeline_train,
context_parallel}_check.py; tests/dist_checkpointing/dcp_{matrix,pp_matrix,async}_check.py).

    from cli_harness import MCPP, WORK, ENV, MPI, failures, run, losses

MCPP / WORK come from argv[1:3]; WORK is emptied. ENV runs mpiexec as root with one OpenMP thread per
rank. run(cmd, np_=None, expect=0, env=None, timeout=400) runs cmd (under `mpiexec -np np_` when np_ is
given; env entries added to ENV) and records a failure (command, exit code, output tails) when the exit
status disagrees with `expect` (0: success, nonzero: failure, None: not checked) instead of raising, so a
check reports every problem at once; each script prints `failures` and exits 1 when any.
losses(d, event="train"): {iteration: lm_loss} of the event's records in d/metrics.jsonl ({} when none);
records(d, event): those records. record_corpus(): the small text corpus most checks train on.
random_tokens() / launcher_model(): the launcher checks' random-token data and tiny GPT (launch_*_check.py).
LLAMA_GQA / TP2_SP / MOE / MOE_LLAMA: shared flag sets; check_continued: a checkpoint continued on another layout.
check_memory_plan / check_stage_plan: a run's memory plan against what its ranks measured
(tools/memory_planner.h), failures recorded. check(cond, msg): msg recorded unless cond.
session_job / start_session_job / finish_session_job: a fault drill's `mcpp train` on np ranks in a session of its
own — hung jobs killed and orphaned processes named; debug_hang_json: `mcpp debug hang --json` parsed
(diagnosis_check.py, forensics_check.py).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

MCPP, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
MPI = ["mpiexec", "--allow-run-as-root", "--oversubscribe"]
failures = []


def run(cmd, np_=None, expect=0, env=None, timeout=400):
    if np_ is not None:
        cmd = MPI + ["-np", str(np_)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, **(env or {})}, timeout=timeout)
    if expect is not None and (expect == 0) != (p.returncode == 0):
        failures.append(f"{' '.join(cmd[:12])}...: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def record_corpus():
    """300 short text records preprocessed (GPT-2 BPE, EOD appended) into WORK/c_text_document; returns that
    data prefix."""
    corpus = os.path.join(WORK, "corpus.jsonl")
    with open(corpus, "w") as f:
        for i in range(300):
            f.write(json.dumps({"text": f"Record {i}: alpha beta gamma {i % 11} delta epsilon {i % 5} zeta."}) + "\n")
    run([MCPP, "data", "preprocess", "--input", corpus, "--output-prefix", os.path.join(WORK, "c"), "--append-eod"])
    return os.path.join(WORK, "c_text_document")


def random_tokens(name="rnd"):
    """200K uniform token ids of a 512 vocabulary in 1000-token documents (bench/gpu/random_tokens.py) as
    WORK/name; returns the data prefix."""
    data = os.path.join(WORK, name)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench", "gpu",
                          "random_tokens.py")
    subprocess.run([sys.executable, script, data, "--tokens", "200000", "--vocab", "512", "--doc-len", "1000"],
                   check=True, capture_output=True)
    return data


def launcher_model(data, layers):
    """The launcher checks' tiny GPT (h 64, 4 heads, T 32, global batch 8 of micro-batches 2, fp32 on CPU, no
    dropout) trained 4 iterations on `data`, every iteration logged, no evaluation."""
    return ["--num-layers", str(layers), "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "512", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--train-iters", "4", "--log-interval", "1", "--eval-iters", "0",
            "--data-path", data, "--split", "100,0,0", "--device", "cpu"]


def losses(d, event="train"):
    p = os.path.join(d, "metrics.jsonl")
    if not os.path.exists(p):
        return {}
    return {r["iteration"]: r["lm_loss"] for r in map(json.loads, open(p)) if r.get("event") == event}


def tiny_train_flags(data_prefix):
    """The CLI checks' tiny GPT (2 layers, h 32, 4 heads, T 16, global batch 8 of micro-batches 2) trained 6
    iterations on data_prefix, every iteration logged, validation at 3 and 6, no dropout, seed 5."""
    return ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
            "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--train-iters", "6", "--log-interval", "1",
            "--eval-interval", "3", "--eval-iters", "1", "--split", "90,10,0", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--data-path", data_prefix, "--seed", "5", "--make-vocab-size-divisible-by",
            "128"]


# A Llama-style model with GQA (2 query groups); TP2 + SP, padding the vocabulary to a multiple of 64 * 2 = 128
# (Megatron) — the same padded size as tiny_train_flags' 128 at TP1.
LLAMA_GQA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
             "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--group-query-attention",
             "--num-query-groups", "2"]
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--make-vocab-size-divisible-by", "64"]
# The MoE checks' layers (moe_check.py, moe_etp_check.py): 4 experts, top-2, FFN 48, the aux loss and the z-loss;
# MOE_LLAMA: the Llama style for them (SwiGLU experts, pre-softmax router, no biases).
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-aux-loss-coeff",
       "0.01", "--moe-z-loss-coeff", "0.001"]
MOE_LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
             "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--moe-router-pre-softmax"]

STDOUT = {}  # run name -> the trainer's stdout (train())


def train(name, np_, flags, timeout=400):
    """`mcpp train <flags> --save WORK/name` on np_ ranks (None: one process); returns the save directory."""
    d = os.path.join(WORK, name)
    STDOUT[name] = run([MCPP, "train", *flags, "--save", d], np_=np_, timeout=timeout).stdout
    return d


def close(a, b, tol=1e-5):
    """a within tol (relative) of b; False when either is missing."""
    return a is not None and b is not None and abs(a - b) <= tol * abs(b)


def same_losses(name, got_dir, ref_dir, iters, tol=1e-5):
    """Every iteration's train loss (iters of them) and every validation loss of got_dir equal ref_dir's within tol;
    differences are recorded in `failures`."""
    a, b = losses(ref_dir), losses(got_dir)
    if len(a) != iters or any(not close(b.get(i), a[i], tol) for i in a):
        failures.append(f"{name}: losses differ from the reference: {b} vs {a}")
    va, vb = losses(ref_dir, "valid"), losses(got_dir, "valid")
    if not va or any(not close(vb.get(i), va[i], tol) for i in va):
        failures.append(f"{name}: validation losses differ from the reference: {vb} vs {va}")


def check_continued(what, part, copy, np_, flags, ref):
    """The checkpoint in `part` (saved at iteration 3 of a 6-iteration run) copied to `copy` (without its metrics) and
    continued by `mcpp train <flags> --load` on np_ ranks logs iterations 4..6 equal to ref's (a losses() dict,
    1e-5); otherwise recorded in `failures`."""
    shutil.copytree(part, copy)
    os.remove(os.path.join(copy, "metrics.jsonl"))
    run([MCPP, "train", *flags, "--load", copy, "--save", copy], np_=np_)
    c = losses(copy)
    if sorted(c) != [4, 5, 6] or any(not close(c.get(i), ref.get(i)) for i in (4, 5, 6)):
        failures.append(f"{what}: the checkpoint continued: {c} vs {ref}")


def check_error(name, cmd, words, np_=None):
    """`mcpp <cmd>` (on np_ ranks) fails on every rank with one error whose first line names every one of `words`,
    exits non-zero and does not hang (120 s); otherwise recorded in `failures`."""
    p = run([MCPP, *cmd], np_=np_, expect=1, timeout=120)
    errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
    if not errs or not all(w in errs[0] for w in words):
        failures.append(f"bad input ({name}): expected an error naming {words}, got {p.stderr[-1500:]!r}")


def records(d, event):
    p = os.path.join(d, "metrics.jsonl")
    return [r for r in map(json.loads, open(p)) if r.get("event") == event] if os.path.exists(p) else []


def check_stage_plan(what, s):
    """One stage of the trainer's activation report against its memory plan: contexts in flight, peak and
    per-microbatch activation bytes equal; the model state as allocated within the distributed optimizer's
    bucket padding (0.1%)."""
    for key in ("in_flight", "peak_bytes", "context_bytes"):
        if s.get("planned_" + key) != s[key] or s[key] <= 0:
            failures.append(f"{what}, stage {s['stage']}: planned_{key} {s.get('planned_' + key)} vs measured {s[key]}")
    m, p = s["model_state_bytes"], s.get("planned_model_state_bytes", -1)
    if not (0 < p <= m <= p + p // 1000):
        failures.append(f"{what}, stage {s['stage']}: model state measured {m} vs planned {p}")


def check_memory_plan(what, d, world, flags, stages):
    """The run in d (`mcpp train <flags>` on `world` ranks): every one of its `stages` pipeline stages planned
    as measured (check_stage_plan), and `mcpp plan memory --json` with the same flags prints the trainer's
    memory_plan record."""
    mem = records(d, "pipeline_activation_memory")
    got = mem[-1]["stages"] if mem else []
    if len(got) != stages:
        failures.append(f"memory plan, {what}: expected {stages} stages in the activation report, got {mem}")
    for s in got:
        check_stage_plan(f"memory plan, {what}", s)
    plan = records(d, "memory_plan")
    cli = run([MCPP, "plan", "memory", "--world", str(world), "--json", *flags])
    if len(plan) != 1 or json.loads(cli.stdout or "null") != plan[0]:
        failures.append(f"memory plan, {what}: `mcpp plan memory --json` {cli.stdout[:300]!r} differs from the "
                        f"trainer's record {plan[:1]}")
    return plan[0] if plan else {}


def check(cond, msg):
    """Records msg in `failures` unless cond; returns cond."""
    if not cond:
        failures.append(msg)
    return cond


def start_session_job(name, np_, flags, env=None):
    """`mcpp train <flags> --save WORK/name` on np_ ranks in a session of its own, stdout and stderr to WORK/name.log;
    returns (the mpiexec process, the save directory, the log's path)."""
    d = os.path.join(WORK, name)
    logf = os.path.join(WORK, name + ".log")
    with open(logf, "w") as log:
        p = subprocess.Popen(MPI + ["-np", str(np_), MCPP, "train", *flags, "--save", d], env={**ENV, **(env or {})},
                             stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return p, d, logf


def finish_session_job(name, p, timeout):
    """Waits for a start_session_job process; kills its session when it outlives timeout (recorded: the job hung);
    records and kills processes of the session still alive after mpiexec returned (orphans). Returns the exit code."""
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        failures.append(f"{name}: the job hung (killed after {timeout} s)")
    time.sleep(0.5)
    try:
        os.killpg(p.pid, 0)
        failures.append(f"{name}: processes of the job's session are alive after mpiexec returned (orphans)")
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return p.returncode


def session_job(name, np_, flags, env=None, timeout=90):
    """start_session_job + finish_session_job: returns (exit code, seconds, the output, the save directory)."""
    t0 = time.monotonic()
    p, d, logf = start_session_job(name, np_, flags, env)
    rc = finish_session_job(name, p, timeout)
    with open(logf) as log:
        return rc, time.monotonic() - t0, log.read(), d


def debug_hang_json(name, d):
    """`mcpp debug hang d --json` parsed; {} (and a failure recorded) when it prints no JSON."""
    p = run([MCPP, "debug", "hang", d, "--json"])
    try:
        return json.loads(p.stdout)
    except ValueError:
        failures.append(f"{name}: mcpp debug hang printed no JSON: {p.stdout[-1500:]} {p.stderr[-800:]}")
        return {}
