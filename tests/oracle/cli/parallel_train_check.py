#!/usr/bin/env python3
"""`mcpp train` under mpiexec against the single-process run (the parallel-equivalence oracle, end to end).

usage: parallel_train_check.py MCPP WORKDIR
  1. TP2 x DP2 with sequence parallelism on 4 ranks: every iteration's lm loss and the validation loss
     equal the 1-rank run's within 1e-5 relative (same padded vocabulary: 128 at tp1, 64 * tp2);
  2. resume under mpiexec: interrupted at 3 (--exit-interval), resumed to 6: bit-identical losses;
  3. the TP2 x DP2 checkpoint loads at TP1 x DP1 (logical tensors resharded) and continues with the
     same losses as the 4-rank run (1e-5);
  4. a bad launch layout (world 3, tp 2) fails on every rank with one clear error, no hang;
  5. --use-distributed-optimizer with --overlap-grad-reduce / --overlap-param-gather and small buckets,
     and --tp-comm-overlap, equals 1 rank; its checkpoint continues at 1 rank with plain Adam;
  6. TP2 x PP2 x DP2 (8 ranks) with SP and the distributed optimizer, and a Llama-style model with
     interleaved PP4 (virtual stages), equal the 1-rank runs;
  7. uneven placements (--decoder-first-pipeline-num-layers, --pipeline-model-parallel-layout) equal 1 rank;
  8. PP2 checkpoints: resume at PP2 bit-exact, continue at PP1 within 1e-5;
  9. PP2 with --no-overwrite-main-grad equals the default bit for bit;
 10. the memory plan (tools/memory_planner.h) of the runs above — TP2 + SP x DP2, TP2 x PP2 x DP2 with the
     distributed optimizer, Llama interleaved PP4, an uneven placement, 1 rank — equals what each stage's ranks
     measured (contexts in flight, peak and per-microbatch activation bytes; the model state allocated, up to
     the distributed optimizer's bucket padding), and `mcpp plan memory --json` with the
     run's flags prints the trainer's memory_plan record;
 11. sample-based training with --rampup-batch-size (1 then 2 microbatches per DP rank) at PP2 x DP2 equals 1 rank;
 12. a --data-path blend ("0.4 P 0.6 P", and "P P" weighed by size) at DP2 equals 1 rank (other samples than P
     alone); an unweighted blend shorter than training needs and a malformed blend are
     one named error.
"""
import os
import shutil
import sys

from cli_harness import (MCPP, MPI, WORK, check_memory_plan, close, failures, losses, record_corpus, run,
                         tiny_train_flags)


record_corpus()
M = tiny_train_flags(os.path.join(WORK, "c_text_document"))  # ends with --make-vocab-size-divisible-by 128
TP1 = ["--make-vocab-size-divisible-by", "128"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--make-vocab-size-divisible-by", "64"]


one = os.path.join(WORK, "one")
run([MCPP, "train", *M, *TP1, "--save", one])
four = os.path.join(WORK, "four")
run(MPI + ["-np", "4", MCPP, "train", *M, *TP2, "--save", four])
a, b = losses(one), losses(four)
if len(a) != 6 or any(not close(b.get(i), a[i]) for i in a):
    failures.append(f"TP2xDP2+SP losses differ from 1 rank: {a} vs {b}")
va, vb = losses(one, "valid"), losses(four, "valid")
if not va or any(not close(vb.get(i), va[i]) for i in va):
    failures.append(f"validation losses differ: {va} vs {vb}")

part = os.path.join(WORK, "part")
run(MPI + ["-np", "4", MCPP, "train", *M, *TP2, "--exit-interval", "3", "--save", part])
run(MPI + ["-np", "4", MCPP, "train", *M, *TP2, "--load", part, "--save", part])
c = losses(part)
if any(c.get(i) != b.get(i) for i in range(1, 7)):
    failures.append(f"4-rank resume is not bit-exact: {b} vs {c}")

reshard = os.path.join(WORK, "reshard")
shutil.copytree(part, reshard)
os.remove(os.path.join(reshard, "metrics.jsonl"))
shutil.rmtree(os.path.join(reshard, "iter_0000006"))
with open(os.path.join(reshard, "latest_checkpointed_iteration.txt"), "w") as f:
    f.write("3")
run([MCPP, "train", *M, *TP1, "--load", reshard, "--save", reshard])
d = losses(reshard)
if any(not close(d.get(i), b[i]) for i in (4, 5, 6)):
    failures.append(f"TP2xDP2 checkpoint continued at TP1: {d} vs {b}")

# 5. distributed optimizer with overlapped grad reduce (many small buckets) and param gather (TP2 x DP2),
#    and --tp-comm-overlap (the SP all-gathers as P2P rings): equals 1 rank; its checkpoint (optimizer state
#    gathered logically) continues at 1 rank without them.
DIST = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "3000",
        "--tp-comm-overlap"]
dist = os.path.join(WORK, "dist")
run(MPI + ["-np", "4", MCPP, "train", *M, *TP2, *DIST, "--exit-interval", "3", "--save", dist])
e = losses(dist)
if len(e) != 3 or any(not close(e.get(i), a[i]) for i in (1, 2, 3)):
    failures.append(f"distributed optimizer + overlap losses differ from 1 rank: {e} vs {a}")
os.remove(os.path.join(dist, "metrics.jsonl"))
run([MCPP, "train", *M, *TP1, "--load", dist, "--save", dist])
f = losses(dist)
if any(not close(f.get(i), a[i]) for i in (4, 5, 6)):
    failures.append(f"distributed-optimizer checkpoint continued at 1 rank: {f} vs {a}")

# 6. TP2 x PP2 x DP2 on 8 ranks with SP and the distributed optimizer (GPT-2 style), and a Llama-style
#    model on 4 ranks with interleaved pipeline stages (PP4, 8 layers, 1 layer per virtual stage, V = 2):
#    every iteration's loss equals the 1-rank run's.
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--group-query-attention",
         "--num-query-groups", "2"]
g3d = os.path.join(WORK, "g3d")
run(MPI + ["-np", "8", MCPP, "train", *M, *TP2, "--pipeline-model-parallel-size", "2",
           "--use-distributed-optimizer", "--metrics-path", os.path.join(g3d, "metrics.jsonl")], timeout=600)
g = losses(g3d)
if len(g) != 6 or any(not close(g.get(i), a[i]) for i in a):
    failures.append(f"TP2xPP2xDP2 (8 ranks) losses differ from 1 rank: {g} vs {a}")
ML = [x for x in M]
ML[ML.index("--num-layers") + 1] = "8"
ML[ML.index("--global-batch-size") + 1] = "8"
l1, l4 = os.path.join(WORK, "l1"), os.path.join(WORK, "l4")
run([MCPP, "train", *ML, *LLAMA, *TP1, "--metrics-path", os.path.join(l1, "metrics.jsonl")])
run(MPI + ["-np", "4", MCPP, "train", *ML, *LLAMA, *TP1, "--pipeline-model-parallel-size", "4",
           "--num-layers-per-virtual-pipeline-stage", "1", "--metrics-path", os.path.join(l4, "metrics.jsonl")],
    timeout=600)
la, lb = losses(l1), losses(l4)
if len(la) != 6 or any(not close(lb.get(i), la[i]) for i in la):
    failures.append(f"Llama interleaved PP4 losses differ from 1 rank: {lb} vs {la}")

# 7. Custom layer placement: 3 layers over PP2 with --decoder-first-pipeline-num-layers 1, and the layout
#    string "Et|ttL" (embedding + layer 0 | layers 1-2 + loss), both equal the 1-rank run.
M3 = list(M)
M3[M3.index("--num-layers") + 1] = "3"
u1 = os.path.join(WORK, "u1")
run([MCPP, "train", *M3, *TP1, "--metrics-path", os.path.join(u1, "metrics.jsonl")])
ua = losses(u1)
for name, flags in (("first1", ["--decoder-first-pipeline-num-layers", "1"]),
                    ("layout", ["--pipeline-model-parallel-layout", "Et|ttL"])):
    d2 = os.path.join(WORK, "u_" + name)
    run(MPI + ["-np", "2", MCPP, "train", *M3, *TP1, "--pipeline-model-parallel-size", "2", *flags,
               "--metrics-path", os.path.join(d2, "metrics.jsonl")], timeout=300)
    ub = losses(d2)
    if len(ua) != 6 or any(not close(ub.get(i), ua[i]) for i in ua):
        failures.append(f"PP2 with {flags}: losses differ from 1 rank: {ub} vs {ua}")

# 8. Pipeline checkpoints: PP2 (tied embeddings split over the stages) interrupted at 3 and resumed at PP2
#    is bit-exact with the straight PP2 run; the same checkpoint continues at PP1 (1 rank) within 1e-5.
PP2 = ["--pipeline-model-parallel-size", "2"]
pps, ppr = os.path.join(WORK, "pp_straight"), os.path.join(WORK, "pp_resume")
run(MPI + ["-np", "2", MCPP, "train", *M, *TP1, *PP2, "--save", pps], timeout=300)
run(MPI + ["-np", "2", MCPP, "train", *M, *TP1, *PP2, "--exit-interval", "3", "--save", ppr], timeout=300)
shutil.copytree(ppr, ppr + "_at1")
run(MPI + ["-np", "2", MCPP, "train", *M, *TP1, *PP2, "--load", ppr, "--save", ppr], timeout=300)
ps, pr = losses(pps), losses(ppr)
if len(ps) != 6 or any(pr.get(i) != ps[i] for i in ps):
    failures.append(f"PP2 resume is not bit-exact: {ps} vs {pr}")
os.remove(os.path.join(ppr + "_at1", "metrics.jsonl"))
run([MCPP, "train", *M, *TP1, "--load", ppr + "_at1", "--save", ppr + "_at1"])
p1 = losses(ppr + "_at1")
if any(not close(p1.get(i), ps[i]) for i in (4, 5, 6)):
    failures.append(f"PP2 checkpoint continued at PP1: {p1} vs {ps}")

# 9. --no-overwrite-main-grad (the grad buffer zeroed at each step's start) trains the PP2 run (tied embedding
#    copies on both stages, 4 microbatches) bit for bit like the default (first gradient writes overwrite).
ppz = os.path.join(WORK, "pp_zeroed")
run(MPI + ["-np", "2", MCPP, "train", *M, *TP1, *PP2, "--no-overwrite-main-grad", "--save", ppz], timeout=300)
pz = losses(ppz)
if pz != ps:
    failures.append(f"PP2 with --no-overwrite-main-grad differs from the default: {pz} vs {ps}")

# 10. memory plan vs measurement, and the CLI's plan vs the trainer's
for name, d, world, flags in (
        ("TP2+SP x DP2", four, 4, [*M, *TP2]),
        ("TP2 x PP2 x DP2", g3d, 8, [*M, *TP2, "--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"]),
        ("Llama PP4 V2", l4, 4, [*ML, *LLAMA, *TP1, "--pipeline-model-parallel-size", "4",
                                 "--num-layers-per-virtual-pipeline-stage", "1"]),
        ("PP2 layout Et|ttL", os.path.join(WORK, "u_layout"), 2,
         [*M3, *TP1, "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et|ttL"]),
        ("1 rank", one, 1, [*M, *TP1])):
    PPF = "--pipeline-model-parallel-size"
    check_memory_plan(name, d, world, flags, int(flags[flags.index(PPF) + 1]) if PPF in flags else 1)

p = run(MPI + ["-np", "3", MCPP, "train", *M, *TP2], expect=1, timeout=120)
errs = [l for l in p.stderr.splitlines() if l.startswith("error:")]
if not errs or not any("tensor_model_parallel_size" in l or "world" in l for l in errs):
    failures.append(f"bad layout: expected an error naming the layout, got {p.stderr[-1500:]!r}")

# 11. sample-based training with a batch-size ramp-up (--train-samples 40 --rampup-batch-size 4 4 8: global batches
#     4, 4, 8, then 8s; 1 then 2 microbatches per DP rank) at PP2 x DP2 equals the 1-rank run: each step's DP slices
#     and pipeline schedule follow the ramp
RAMP = [a for a in M]
for flag in ("--train-iters", "--lr-warmup-iters", "--lr-decay-style"):
    i = RAMP.index(flag)
    del RAMP[i:i + 2]
RAMP += ["--train-samples", "40", "--rampup-batch-size", "4", "4", "8", "--lr-decay-style", "linear"]
ramp1 = os.path.join(WORK, "ramp1")
run([MCPP, "train", *RAMP, "--save", ramp1])
ramp4 = os.path.join(WORK, "ramp4")
run(MPI + ["-np", "4", MCPP, "train", *RAMP, "--pipeline-model-parallel-size", "2", "--save", ramp4])
r1, r4 = losses(ramp1), losses(ramp4)
if len(r1) != 6 or any(not close(r4.get(i), r1[i]) for i in r1):  # 4 + 4 + 8 while <= 8, then (40 - 16) / 8
    failures.append(f"--rampup-batch-size PP2 x DP2 differs from 1 rank (or not 6 iterations): {r4} vs {r1}")

# 12. data blends at DP2 equal 1 rank and train on other samples than the plain prefix: --data-path 0.4 P 0.6 P
#     (Megatron's BlendedDataset over two datasets), and P P without weights (Megatron: one epoch of each, weighed by
#     their sizes); an unweighted blend holding fewer samples than training needs is one named error
i = M.index("--data-path")


def check_blend(name, paths):
    flags = M[:i + 1] + paths + M[i + 2:]
    d1, d2 = os.path.join(WORK, name + "1"), os.path.join(WORK, name + "2")
    run([MCPP, "train", *flags, "--save", d1])
    run(MPI + ["-np", "2", MCPP, "train", *flags, "--save", d2])
    l1, l2 = losses(d1), losses(d2)
    if len(l1) != 6 or any(not close(l2.get(k), l1[k]) for k in l1) or l1.get(1) == a.get(1):
        failures.append(f"--data-path {' '.join(paths)}: DP2 {l2} vs 1 rank {l1} (plain prefix: {a})")
    return flags


check_blend("blend", ["0.4", M[i + 1], "0.6", M[i + 1]])
UNW = check_blend("unweighted", [M[i + 1], M[i + 1]])
p = run([MCPP, "train", *UNW, "--train-iters", "400", "--lr-decay-iters", "400"], expect=1)
if "prefixes without weights holds" not in p.stderr or "train split needs 3200" not in p.stderr:
    failures.append(f"an unweighted blend too short for training: expected a named error, got {p.stderr[-500:]!r}")
p = run([MCPP, "train", *M[:i + 1], "0.5", M[i + 1], M[i + 1], M[i + 1], *M[i + 2:]], expect=2)
if "mixes weights and prefixes" not in p.stderr:
    failures.append(f"a malformed blend: expected a named error, got {p.stderr[-500:]!r}")

if failures:
    print("FAILED:\n" + "\n".join(failures))
    sys.exit(1)
print(f"parallel train checks: PASS (losses {[round(a[i], 6) for i in sorted(a)]})")
