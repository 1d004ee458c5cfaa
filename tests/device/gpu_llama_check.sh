#!/bin/bash
# Llama-style multi-GPU equivalence and odd shapes on GPUs (kind nvidia-h200-x2), through the CLI:
#   a Llama-style model (RMSNorm, SwiGLU, RoPE, grouped-query attention with 2 query groups of 4 heads, untied
#   output layer, no biases) trained 6 steps in fp32 on one GPU, DP2, TP2 + sequence parallel (the query groups
#   split over TP), PP2 and DP2 + the distributed optimizer: per-iteration loss vs one GPU (relative 1e-5, only
#   reduction order differs); the same bf16 on one GPU vs TP2 + SP (5e-3);
#   odd shapes on one GPU, bf16: a sequence of 200 (not a multiple of the attention tiles), a vocabulary of
#   1001 padded to 1008 by --make-vocab-size-divisible-by 16 (the cross entropy's vector path), FFN 680
#   (SwiGLU; not a multiple of 128), hidden 320 with 5 heads of 64: each trains with finite, falling losses.
# Exit 1 on any mismatch or failed run.
# usage (repo root, device_carry/ from bench/gpu/make_carry.sh carried): tests/device/gpu_llama_check.sh OUT
set -u
OUT=${1:?usage: gpu_llama_check.sh OUT}
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_small
LLAMA="--normalization RMSNorm --swiglu --position-embedding-type rope --group-query-attention --num-query-groups 2
  --num-attention-heads 8 --untie-embeddings-and-output-weights --disable-bias-linear"
RUN_FLAGS="--num-layers 4 $SMALL_MODEL $LLAMA"
run_train gpu1 1
run_train dp2 2
run_train tp2sp 2 --tensor-model-parallel-size 2 --sequence-parallel
run_train pp2 2 --pipeline-model-parallel-size 2
run_train dp2_distopt 2 --use-distributed-optimizer --overlap-grad-reduce
run_train gpu1_bf16 1 --bf16
run_train tp2sp_bf16 2 --bf16 --tensor-model-parallel-size 2 --sequence-parallel
RUN_FLAGS="--num-layers 2 $SMALL_MODEL $LLAMA --bf16"
run_train odd_seq 1 --seq-length 200 --max-position-embeddings 256
run_train odd_vocab 1 --vocab-size 1001 --make-vocab-size-divisible-by 16
run_train odd_ffn 1 --ffn-hidden-size 680
run_train odd_hidden 1 --hidden-size 320 --num-attention-heads 5 --num-query-groups 5
python3 - "$OUT" <<'PY'
import math, sys
sys.path.insert(0, "tests/device")
from loss_check import Checks
c = Checks(sys.argv[1])
c.same_losses("gpu1", ["dp2", "tp2sp", "pp2", "dp2_distopt"], 1e-5)
c.same_losses("gpu1_bf16", ["tp2sp_bf16"], 5e-3)
for n in ["odd_seq", "odd_vocab", "odd_ffn", "odd_hidden"]:
    l = c.losses(n)
    good = len(l) == 6 and all(math.isfinite(x) for x in l) and l[-1] < l[0]
    c.ok &= good
    print(f"{n:12s} {'OK ' if good else 'BAD'} losses {[round(x, 4) for x in l]}")
print("GPU LLAMA EQUIVALENCE", "OK" if c.ok else "FAILED")
sys.exit(0 if c.ok else 1)
PY
