#!/bin/bash
# SM clock and board power while the GPT 1.3B step runs (ours: `mcpp train`, 40 iterations; then the PyTorch
# anchor's 1.3b config), sampled by nvidia-smi every 100 ms on GPU 0 — is the training loop power-limited
# (GEMMs running below their isolated rate because the clock drops)? Prints, per run, the median / p10 / p90
# of the SM clock (MHz) and power (W) over the samples with GPU utilization >= 95% (the steady part), and
# the board's power limit and max SM clock.
# usage (device machine, repo root, device_carry/ carried): bench/gpu/clocks_power.sh OUT
set -u
OUT=$1
mkdir -p "$OUT"
. bench/gpu/env.sh
python3 bench/gpu/random_tokens.py /tmp/rnd --tokens 4000000 --vocab 50304 --doc-len 8192 >/dev/null
nvidia-smi -i 0 --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
sample() {  # sample NAME: nvidia-smi in the background until stop_sample
  nvidia-smi -i 0 --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 \
    > "$OUT/$1.csv" 2>/dev/null &
  SAMPLER=$!
}
stop_sample() { kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; }
sample mcpp_1.3b
CUDA_VISIBLE_DEVICES=0 "$MCPP" train --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 \
  --max-position-embeddings 2048 --micro-batch-size 8 --global-batch-size 8 --tokenizer-type NullTokenizer \
  --vocab-size 50304 --make-vocab-size-divisible-by 128 --hidden-dropout 0 --attention-dropout 0 --bf16 \
  --device cuda --lr 1e-4 --lr-decay-style constant --train-iters 40 --log-interval 10 --eval-iters 0 \
  --data-path /tmp/rnd --split 100,0,0 > "$OUT/mcpp_1.3b.log" 2>&1
stop_sample
grep -o "elapsed time per iteration (ms): [0-9.]*" "$OUT/mcpp_1.3b.log" | tail -1
sample torch_1.3b
CUDA_VISIBLE_DEVICES=0 python3 "$C/anchors/torch_gpt.py" 1.3b > "$OUT/torch_1.3b.log" 2>&1
stop_sample
grep '^{' "$OUT/torch_1.3b.log" | cut -c1-160
python3 - "$OUT" <<'PY'
import csv, statistics, sys
out = sys.argv[1]
for name in ("mcpp_1.3b", "torch_1.3b"):
    rows = []
    for r in csv.reader(open(f"{out}/{name}.csv")):
        try:
            rows.append(tuple(float(v) for v in r))
        except ValueError:
            pass
    busy = [r for r in rows if r[0] >= 95]
    if not busy:
        print(f"{name}: no busy samples ({len(rows)} samples)"); continue
    def q(i, p):
        v = sorted(r[i] for r in busy)
        return v[min(len(v) - 1, int(p * len(v)))]
    print(f"{name}: {len(busy)} busy samples of {len(rows)}; SM clock MHz median {q(1, .5):.0f} (p10 {q(1, .1):.0f}, "
          f"p90 {q(1, .9):.0f}); power W median {q(2, .5):.0f} (p10 {q(2, .1):.0f}, p90 {q(2, .9):.0f})")
PY
