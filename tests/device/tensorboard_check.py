"""Reads an `mcpp train --tensorboard-dir TB --metrics-path M.jsonl --log-interval 1` run's event files with
TensorBoard's own EventAccumulator and checks that every scalar equals the metrics JSONL's value (TensorBoard keeps
float32: compared after rounding the JSONL value to float32): lm loss, learning-rate, grad-norm, batch-size per
iteration (and their "vs samples" twins' values), throughput (TFLOP/s/GPU) and iteration-time with
--log-timers-to-tensorboard, the timers' "<name>-time" (max over ranks), mem-*-bytes with --log-memory-to-tensorboard,
lm loss validation (+ ppl). Prints "tensorboard check passed: N scalars in K tags" or the mismatches (exit 1).

usage (device machine, repo root, after `. bench/gpu/env.sh && make_rnd_124m`):
  $MCPP train $M124 --micro-batch-size 8 --global-batch-size 8 --train-iters 20 --log-interval 1 \
    --eval-interval 10 --eval-iters 2 --split 98,2,0 --timing-log-level 1 --tensorboard-dir /tmp/tbc/tb \
    --log-timers-to-tensorboard --log-memory-to-tensorboard --log-validation-ppl-to-tensorboard \
    --metrics-path /tmp/tbc/metrics.jsonl
  python3 tests/device/tensorboard_check.py /tmp/tbc/tb /tmp/tbc/metrics.jsonl
"""
import json
import math
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    tb_dir, metrics = sys.argv[1], sys.argv[2]
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    tb = {}  # the first event of a tag at a step (Megatron's end-of-training validation repeats the last step)
    for t in tags:
        for e in acc.Scalars(t):
            tb.setdefault(t, {}).setdefault(e.step, e.value)
    recs = [json.loads(l) for l in open(metrics)]
    train = {r["iteration"]: r for r in recs if r.get("event") == "train"}
    valid = {r["iteration"]: r for r in recs if r.get("event") == "valid" and not r.get("end_of_training")}
    bad, n = [], 0

    def same(tag, step, want):
        nonlocal n
        got = tb.get(tag, {}).get(step)
        n += 1
        if got is None or got != f32(want):
            bad.append(f"{tag} at {step}: tensorboard {got} vs jsonl {want}")

    if not train:
        sys.exit(f"no train records in {metrics}")
    for it, r in train.items():  # --log-interval 1: the window is the iteration
        same("lm loss", it, r["lm_loss"])
        same("learning-rate", it, r["learning_rate"])
        same("grad-norm", it, r["grad_norm"])
        same("batch-size", it, r["global_batch_size"])
        same("lm loss vs samples", r["consumed_samples"], r["lm_loss"])
        if "throughput" in tb:
            same("throughput", it, r["tflops_per_gpu"])
            same("iteration-time", it, r["elapsed_ms_per_iter"] / 1000.0)
            for name, mm in r.get("timers_ms", {}).items():
                same(name + "-time", it, mm["max"])
        if "mem-allocated-bytes" in tb:
            same("mem-allocated-bytes", it, r["memory"]["allocated_bytes"])
            same("mem-reserved-bytes", it, r["memory"]["reserved_bytes"])
            same("mem-max-allocated-bytes", it, r["memory"]["peak_bytes"])
    for it, r in valid.items():
        same("lm loss validation", it, r["lm_loss"])
        if "lm loss validation ppl" in tb:
            same("lm loss validation ppl", it, math.exp(min(r["lm_loss"], 20.0)))
    for required in ("lm loss", "learning-rate", "grad-norm"):
        if required not in tb:
            bad.append(f"no {required!r} scalars (tags: {tags})")
    if bad:
        print("\n".join(bad[:50]))
        sys.exit(1)
    print(f"tensorboard check passed: {n} scalars in {len(tags)} tags")


if __name__ == "__main__":
    main()
