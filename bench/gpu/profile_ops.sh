#!/bin/bash
# Per-op breakdown of one GPU training configuration (MCPP_PROFILE_OPS=1: every op timed between device
# synchronizations, so the sum is the kernels' time without overlap; the table goes to stderr at exit).
# usage (device machine, repo root, device_carry/ carried): bench/gpu/profile_ops.sh OUT [L d h T B]
# DROPOUT=0.1: Megatron's default hidden and attention dropout (default 0: none, as the e2e benchmark).
# EXTRA='flags': more `mcpp train` flags (e.g. MoE: EXTRA='--num-experts 8 --moe-router-topk 2'); TAG names the log.
set -u
OUT=$1
L=${2:-12} d=${3:-768} h=${4:-12} T=${5:-1024} B=${6:-32}
mkdir -p "$OUT"
. bench/gpu/env.sh
[ -f /tmp/rnd.bin ] || python3 bench/gpu/random_tokens.py /tmp/rnd --tokens 4000000 --vocab 50304 >/dev/null
CUDA_VISIBLE_DEVICES=${GPU:-0} MCPP_PROFILE_OPS=1 "$MCPP" train --num-layers "$L" --hidden-size "$d" \
  --num-attention-heads "$h" --seq-length "$T" --max-position-embeddings "$T" --micro-batch-size "$B" \
  --global-batch-size "$B" --tokenizer-type NullTokenizer --vocab-size 50304 --hidden-dropout "${DROPOUT:-0}" \
  --attention-dropout "${DROPOUT:-0}" --bf16 --device cuda --train-iters 4 --log-interval 1 --eval-iters 0 \
  --data-path /tmp/rnd --split 100,0,0 ${EXTRA:-} > "$OUT/profile_L${L}_d${d}_p${DROPOUT:-0}${TAG:-}.log" 2>&1
echo "== op profile L$L d$d h$h T$T B$B dropout ${DROPOUT:-0} ${EXTRA:-} (steps 2-4; the first, warm-up step is not counted)"
sed -n '/op profile/,$p' "$OUT/profile_L${L}_d${d}_p${DROPOUT:-0}${TAG:-}.log"
