#!/usr/bin/env bash
# Prepares hf_carry/ for tests/device/hf_logits_check.py: trains tiny models of the named styles (default: all) for 5
# iterations, writes their logits on fixed tokens with `mcpp forward` and exports them with `mcpp ckpt export
# --format hf-<name>`:
#   gpt2, llama, mixtral (the Llama one with 4 SwiGLU experts top-2 in every layer), qwen2-moe (q/k/v biases, layer 0
#   MoE with pre-softmax routing and a gated shared expert, layer 1 dense) on DATA (a Megatron prefix, GPT-2
#   vocabulary; the Llama-style ones with RoPE base 500000, so that the base's config fields are checked);
#   qwen2 (Llama's with q/k/v biases), qwen3 (--qk-layernorm, head dim 32 != 64 / 4 heads) and qwen3-moe (the same
#   attention, layer 1 MoE with 4 experts top-2, normalized top-k) on random tokens of a 512-token vocabulary
#   (NullTokenizer), so they stay small; llama3 (Llama's with --use-rope-scaling --rope-scaling-factor 8, Llama 3.1's
#   RoPE scaling; max position 2048) on those random tokens, its logits on two sequences of 2048 tokens (positions
#   that reach every band of the scaling); llama-linear (--rotary-seq-len-interpolation-factor 4, HF rope_type linear)
#   the same way.
# Then on the device:
#   run(command="python3 tests/device/hf_logits_check.py NAME...", carry=["hf_carry"])
# Two of the GPT-2-vocabulary exports fit the device tool's 64 MiB carry (with the binaries of bench/gpu/make_carry.sh:
# the two qwen3 ones).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:?usage: prepare_hf_check.sh DATA_PREFIX [NAME...]}
shift
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(gpt2 llama mixtral qwen2-moe qwen2 qwen3 qwen3-moe llama3 llama-linear)
MCPP=build/bin/mcpp
OUT=hf_carry
rm -rf $OUT && mkdir -p $OUT
B="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 32
   --micro-batch-size 2 --global-batch-size 4 --lr 1e-2 --lr-warmup-iters 1 --train-iters 5 --log-interval 5
   --eval-interval 100 --eval-iters 0 --split 90,10,0 --hidden-dropout 0 --attention-dropout 0"
LLAMA="--normalization RMSNorm --swiglu --position-embedding-type rope --untie-embeddings-and-output-weights
  --disable-bias-linear --group-query-attention --num-query-groups 2 --rotary-base 500000"
{ echo "464 2068 7586 21831 18045 625 262 16931 3290 13 50256 318 257 1332 286 262"
  echo "13313 352 25 262 2068 7586 21831 18045 625 262 16931 3290 13 464 2068 7586"; } > $OUT/tokens.txt
{ echo "464 68 86 31 45 25 262 131 290 13 511 318 257 132 286 262"
  echo "133 352 25 262 206 75 218 180 25 262 169 329 13 464 206 58"; } > $OUT/tokens512.txt
SMALL=""
for m in "${NAMES[@]}"; do
  case $m in
    gpt2) FLAGS="--data-path $DATA" ;;
    llama) FLAGS="$LLAMA --data-path $DATA" ;;
    mixtral) FLAGS="$LLAMA --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 96 --moe-aux-loss-coeff 0.01
                    --data-path $DATA" ;;
    qwen2-moe) FLAGS="$LLAMA --add-qkv-bias --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48
                      --moe-router-pre-softmax --moe-layer-freq [1,0] --moe-shared-expert-intermediate-size 64
                      --moe-shared-expert-gate --moe-aux-loss-coeff 0.01 --data-path $DATA" ;;
    qwen2|qwen3|qwen3-moe|llama3|llama-linear)
      if [ -z "$SMALL" ]; then
        /usr/bin/python3 bench/gpu/random_tokens.py $OUT/rnd512 --tokens 20000 --vocab 512 --doc-len 64 > /dev/null
        SMALL="--tokenizer-type NullTokenizer --vocab-size 512 --data-path $OUT/rnd512"
      fi
      QWEN3="$LLAMA --qk-layernorm --kv-channels 32 $SMALL"
      case $m in
        qwen2) FLAGS="$LLAMA --add-qkv-bias $SMALL" ;;
        llama3) FLAGS="$LLAMA --use-rope-scaling --rope-scaling-factor 8 $SMALL" ;;
        llama-linear) FLAGS="$LLAMA --rotary-seq-len-interpolation-factor 4 $SMALL" ;;
        qwen3) FLAGS="$QWEN3" ;;
        qwen3-moe) FLAGS="$QWEN3 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-layer-freq [0,1]
                          --moe-aux-loss-coeff 0.01" ;;
      esac ;;
    *) echo "unknown model style '$m' (gpt2 llama mixtral qwen2-moe qwen2 qwen3 qwen3-moe llama3 llama-linear)" >&2
       exit 2 ;;
  esac
  BM=$B
  if [ "$m" = llama3 ] || [ "$m" = llama-linear ]; then
    BM=${B/--max-position-embeddings 32/--max-position-embeddings 2048}
    /usr/bin/python3 -c "import numpy as np; np.savetxt('$OUT/tokens_long.txt', np.random.default_rng(3).integers(0, 512, (2, 2048)), fmt='%d')"
  fi
  $MCPP train $BM $FLAGS --save $OUT/$m > /dev/null
  TOK=$OUT/tokens.txt
  FORMAT=hf-$m
  case $m in qwen2|qwen3*) TOK=$OUT/tokens512.txt ;; llama3|llama-linear) TOK=$OUT/tokens_long.txt FORMAT=hf-llama ;; esac
  $MCPP forward --load $OUT/$m --tokens $TOK --output $OUT/$m.npy
  $MCPP ckpt export --load $OUT/$m --format $FORMAT --output $OUT/hf-$m
  rm -rf $OUT/$m  # keep the carry small
done
rm -f $OUT/rnd512.bin $OUT/rnd512.idx
du -sh $OUT
# The import direction of the HF conversion, with HF's own writer: on the device (torch + transformers) build random
# MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM and Qwen3MoeForCausalLM models (GQA 4:2, untied, vocab
# 512; the MoE ones 4 experts top-2; Qwen2-MoE: q/k/v biases, unnormalized top-k, a gated shared expert, layer 1
# dense; Qwen3: head_dim 32 != 64 / 4; Qwen3-MoE: layer 0 dense), save them with save_pretrained (safetensors) and
# write their fp32 logits on two fixed 16-token sequences:
#   python3 tests/device/hf_import_check.py make OUTDIR [NAME...]
# then here, for each NAME: `mcpp ckpt import --input OUTDIR/hf-NAME-ref --format hf-NAME`,
# `mcpp forward --tokens OUTDIR/tokens.txt` and
#   python3 tests/device/hf_import_check.py compare OUTDIR NAME OURS.npy
# (max relative logit error < 1e-4, as hf_logits_check.py).
