#!/usr/bin/env bash
# Prepares device_carry/ for tests/device/hf_logits_check.py: trains a tiny GPT-2-style, a tiny Llama-style and a
# tiny Mixtral-style (the Llama one with 4 SwiGLU experts top-2 in every layer) and a tiny Qwen2-MoE-style (q/k/v
# biases, layer 0 MoE with pre-softmax routing and a gated shared expert, layer 1 dense) model for 5 iterations on
# DATA (a Megatron prefix, GPT-2 vocabulary), writes their logits on fixed tokens with `mcpp forward`, and exports
# them with `mcpp ckpt export` (hf-gpt2, hf-llama, hf-mixtral, hf-qwen2-moe; the Llama-style ones with RoPE base
# 500000, so that the base's config fields are checked). Then on the device:
#   run(command="python3 tests/device/hf_logits_check.py", carry=["device_carry"])
# The exports together exceed the device tool's 64 MiB carry (two fit): delete the others' hf-<name>/ and <name>.npy
# and name the two (`hf_logits_check.py mixtral qwen2-moe`).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:?usage: prepare_hf_check.sh DATA_PREFIX}
MCPP=build/bin/mcpp
rm -rf device_carry && mkdir -p device_carry
B="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32
   --micro-batch-size 2 --global-batch-size 4 --lr 1e-2 --lr-warmup-iters 1 --train-iters 5 --log-interval 5
   --eval-interval 100 --eval-iters 0 --split 90,10,0 --hidden-dropout 0 --attention-dropout 0 --data-path $DATA"
$MCPP train $B --save device_carry/gpt2 > /dev/null
LLAMA="--normalization RMSNorm --swiglu --position-embedding-type rope --untie-embeddings-and-output-weights
  --disable-bias-linear --group-query-attention --num-query-groups 2 --rotary-base 500000"
$MCPP train $B $LLAMA --save device_carry/llama > /dev/null
$MCPP train $B $LLAMA --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 96 --moe-aux-loss-coeff 0.01 \
  --save device_carry/mixtral > /dev/null
$MCPP train $B $LLAMA --add-qkv-bias --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 \
  --moe-router-pre-softmax --moe-layer-freq "[1,0]" --moe-shared-expert-intermediate-size 64 --moe-shared-expert-gate \
  --moe-aux-loss-coeff 0.01 --save device_carry/qwen2-moe > /dev/null
printf "464 2068 7586 21831 18045 625 262 16931 3290 13 50256 318 257 1332 286 262\n13313 352 25 262 2068 7586 21831 18045 625 262 16931 3290 13 464 2068 7586\n" > device_carry/tokens.txt
for m in gpt2 llama mixtral qwen2-moe; do
  $MCPP forward --load device_carry/$m --tokens device_carry/tokens.txt --output device_carry/$m.npy
  $MCPP ckpt export --load device_carry/$m --format hf-$m --output device_carry/hf-$m
  rm -rf device_carry/$m  # keep the carry under 64 MiB
done
du -sh device_carry
