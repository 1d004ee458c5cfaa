#!/usr/bin/env python3
"""`mcpp train` pipeline features end to end, against single-process (or flag-off) runs.

usage: pipeline_train_check.py MCPP WORKDIR
  1. --use-distributed-optimizer with virtual stages: PP4 x V2 x DP2 on 8 ranks (one DDP per chunk, one
     optimizer over all chunks' buffers, small buckets + overlapped reduce) equals 1 rank (1e-5 per loss);
  2. --calculate-per-token-loss with --eod-mask-loss (masks differ between microbatches): PP2 x DP2 on 4
     ranks equals PP1 x DP1 (1e-5), and differs from the default per-microbatch mean (the flag acts);
  3. activation recompute with hidden + attention dropout (unfused attention) at PP2: full uniform, full
     block, selective and selective with `--recompute-modules core_attn mlp` give bit-identical losses to no
     recompute (the MLP's too holding fewer bytes);
  4. the pipeline_activation_memory record at PP2: in flight = pp - stage (1F1B, M >= pp), peak bytes =
     in flight x one context's bytes, recompute shrinks the per-microbatch bytes; and the memory plan's
     figures in it (tools/memory_planner.h) equal the measured ones with and without recompute (full uniform,
     full block, selective, selective + mlp; unfused attention, dropout) and for PP4 x V2 — activations exactly,
     the allocated model state up to the distributed optimizer's bucket padding;
  5. --variable-seq-lengths at PP2 (shape exchange before every transfer): bit-identical losses;
  6. distributed optimizer + PP2 x DP2 + tied embeddings: a resume from iteration 2 reproduces the
     straight run's losses and grad norms bit for bit (the shared embedding has its own DDP bucket, so both
     stages shard it identically over DP; before that fix the last stage's copy drifted from the owner);
  7. --account-for-embedding/loss-in-pipeline-split: 8 layers over PP3 (2|3|3, 3|3|2) equal 1 rank; 10 slots
     over 3 stages is an error naming them.
"""
import json
import os
import sys

from cli_harness import (MCPP, MPI, WORK, check_stage_plan, close, failures, losses, records,
                         run)


corpus = os.path.join(WORK, "corpus.jsonl")
with open(corpus, "w") as f:
    for i in range(300):
        words = " ".join(f"w{(i * 7 + j) % 13}" for j in range(i % 9))  # EODs at varying positions
        f.write(json.dumps({"text": f"Record {i}: {words}."}) + "\n")
run([MCPP, "data", "preprocess", "--input", corpus, "--output-prefix", os.path.join(WORK, "c"), "--append-eod"])
M = ["--num-layers", "8", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
     "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "16", "--lr", "1e-3",
     "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--train-iters", "4", "--log-interval", "1",
     "--split", "100,0,0", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
     "--data-path", os.path.join(WORK, "c_text_document"), "--seed", "5", "--make-vocab-size-divisible-by", "128"]


def train(name, flags, np=1, timeout=300):
    d = os.path.join(WORK, name)
    cmd = ([] if np == 1 else MPI + ["-np", str(np)]) + [MCPP, "train", *M, *flags,
                                                         "--metrics-path", os.path.join(d, "metrics.jsonl")]
    run(cmd, timeout=timeout)
    return d


def same(a, b, tol=None):
    if len(a) != 4 or set(a) != set(b):
        return False
    return all((a[i] == b[i]) if tol is None else close(b[i], a[i], tol) for i in a)


# 1. distributed optimizer + virtual stages
one = losses(train("one", []))
DIST = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "2000"]
v2 = losses(train("pp4v2_dist", ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1",
                                 *DIST], np=8, timeout=600))
if not same(one, v2, 1e-5):
    failures.append(f"PP4 V2 + distributed optimizer + DP2 differs from 1 rank: {v2} vs {one}")

# 2. per-token loss
PT = ["--calculate-per-token-loss", "--eod-mask-loss"]
pt1 = losses(train("pt1", PT))
pt4 = losses(train("pt4", [*PT, "--pipeline-model-parallel-size", "2"], np=4))
if not same(pt1, pt4, 1e-5):
    failures.append(f"per-token loss PP2 x DP2 differs from 1 rank: {pt4} vs {pt1}")
mean1 = losses(train("mean1", ["--eod-mask-loss"]))
if pt1.get(1) is None or close(pt1.get(1), mean1.get(1), 1e-6):
    failures.append(f"per-token loss equals the per-microbatch mean (masks should make them differ): {pt1} {mean1}")

# 3./4. recompute with dropout at PP2, and the activation memory record
DROP = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--attention-impl", "unfused",
        "--pipeline-model-parallel-size", "2"]
base_dir = train("rc_off", DROP, np=2)
base = losses(base_dir)
for name, flags in (("rc_uniform", ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "2"]),
                    ("rc_block", ["--recompute-granularity", "full", "--recompute-method", "block",
                                  "--recompute-num-layers", "3"]),
                    ("rc_selective", ["--recompute-granularity", "selective"]),
                    ("rc_selective_mlp", ["--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                          "mlp"])):
    d = train(name, [*DROP, *flags], np=2)
    got = losses(d)
    if not same(base, got):
        failures.append(f"{name}: losses not bit-identical to no recompute: {got} vs {base}")


def memory(d):
    recs = records(d, "pipeline_activation_memory")
    return {s["stage"]: s for s in recs[-1]["stages"]} if recs else {}


mem_off, mem_rc = memory(base_dir), memory(os.path.join(WORK, "rc_uniform"))
if sorted(mem_off) != [0, 1]:
    failures.append(f"no pipeline_activation_memory record for both stages: {mem_off}")
for st, s in mem_off.items():
    if s["in_flight"] != 2 - st:
        failures.append(f"stage {st}: {s['in_flight']} contexts in flight, 1F1B says {2 - st}")
    if s["peak_bytes"] != s["in_flight"] * s["context_bytes"]:
        failures.append(f"stage {st}: peak bytes {s['peak_bytes']} != in flight x context bytes {s}")
    if st in mem_rc and not mem_rc[st]["context_bytes"] < s["context_bytes"]:
        failures.append(f"stage {st}: recompute did not shrink the context bytes: {mem_rc[st]} vs {s}")
if (st_sel := memory(os.path.join(WORK, "rc_selective"))) and any(
        not memory(os.path.join(WORK, "rc_selective_mlp")).get(st, {}).get("context_bytes", 1 << 62) <
        s["context_bytes"] for st, s in st_sel.items()):
    failures.append("--recompute-modules core_attn mlp did not shrink the contexts below core_attn alone")
for name in ("rc_off", "rc_uniform", "rc_block", "rc_selective", "rc_selective_mlp", "pp4v2_dist"):
    mem = memory(os.path.join(WORK, name))
    if len(mem) != (4 if name == "pp4v2_dist" else 2):
        failures.append(f"{name}: no activation report for every stage: {mem}")
    for s in mem.values():
        check_stage_plan(name, s)

# 5. variable sequence lengths (the dataset's shapes are fixed: the exchange must not change anything)
PP2 = ["--pipeline-model-parallel-size", "2"]
fixed = losses(train("fixed", PP2, np=2))
var = losses(train("var", [*PP2, "--variable-seq-lengths"], np=2))
if not same(fixed, var):
    failures.append(f"--variable-seq-lengths changed the losses: {var} vs {fixed}")

# 6. resume bit-exact with distributed optimizer + PP2 x DP2 + tied embeddings (GPT-2 vocab: the embedding
# spans DP shard boundaries)
DO = [*PP2, "--use-distributed-optimizer"]
straight = train("do_straight", DO, np=4)
train("do_first", [*DO, "--save", os.path.join(WORK, "do_ckpt"), "--save-interval", "2", "--exit-interval", "2"], np=4)
resumed = train("do_resumed", [*DO, "--load", os.path.join(WORK, "do_ckpt")], np=4)
norms = lambda d: {r["iteration"]: (r["lm_loss"], r["grad_norm"]) for r in records(d, "train")}
a, b = norms(straight), norms(resumed)
if sorted(b) != [3, 4] or any(a.get(i) != b[i] for i in b):
    failures.append(f"distopt + PP2 x DP2 tied resume not bit-exact: straight {a} vs resumed {b}")

# 7. Megatron-Core's account-for flags: 8 layers over PP3 (not divisible without them): counting the
# embedding builds 2 | 3 | 3 layers, counting the loss 3 | 3 | 2; both equal 1 rank, and stage 0 holds fewer
# activation bytes when it builds fewer layers.
acc = {}
for flag in ("embedding", "loss"):
    d = train(f"pp3_{flag}", ["--pipeline-model-parallel-size", "3", f"--account-for-{flag}-in-pipeline-split"], np=3)
    acc[flag] = memory(d)
    if not same(one, losses(d), 1e-5):
        failures.append(f"PP3 --account-for-{flag}-in-pipeline-split differs from 1 rank: {losses(d)} vs {one}")
if sorted(acc["embedding"]) != [0, 1, 2] or sorted(acc["loss"]) != [0, 1, 2] or \
        not acc["embedding"][0]["context_bytes"] < acc["loss"][0]["context_bytes"]:
    failures.append(f"account-for stage 0 context bytes: embedding {acc['embedding'].get(0)} loss {acc['loss'].get(0)}")
r = run([MCPP, "train", *M, "--pipeline-model-parallel-size", "3", "--account-for-embedding-in-pipeline-split",
         "--account-for-loss-in-pipeline-split"], np_=3, expect=None)
if r.returncode == 0 or "10 layer slots" not in r.stderr:
    failures.append(f"8 layers + embedding + loss over PP3: exit {r.returncode}, stderr {r.stderr[-500:]!r}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("pipeline CLI checks passed")
