#!/bin/bash
# Side-by-side GPU training throughput, ours vs the PyTorch anchor (../shared/anchors/torch_gpt.py:
# nanoGPT-style GPT, bf16 autocast, SDPA flash attention, fused AdamW, torch.compile), in ONE device call
# so the ratio is measured on the same machine at the same time. Both train on random tokens with the
# same shapes: GPT-2 124M (V 50304, T 1024, d 768, L 12, h 12, B 32) and GPT 1.3B (T 2048, d 2048,
# L 24, h 16, B 8); no dropout, tied embeddings, biases, LayerNorm, GELU(tanh).
# Ours: `mcpp train --bf16 --device cuda`, 40 iterations each logged (a step ends with the host reading
# its loss, so each logged time is one whole step); step time = the median of iterations 11-40, the
# anchor's own method (median of 30 steps after 10 warm-up steps), tokens/s = B*T / that; the mean, min
# and max of those 30 are printed too. Peak memory from the CUDA pool's high-water mark. (Until
# 2026-11-30 evening: 30 iterations logged every 10, the mean of the last window 21-30.)
# 124m-graph / 1.3b-graph: the same runs with --enable-cuda-graph (captured after 3 eager warm-up steps);
# 124m-zeroed / 1.3b-zeroed: with --no-overwrite-main-grad (the grad buffer zeroed each step: the A/B of the
# first wgrad GEMMs overwriting the main grads); 124m-dropout / 1.3b-dropout: with Megatron's default dropout
# (--attention-dropout 0.1 --hidden-dropout 0.1: cuDNN attention with its RNG node, hidden dropout inside the
# norms; the anchor has none).
# 1.3b-llama / 1.3b-qk: the 1.3B shapes Llama-style (RMSNorm, SwiGLU of Megatron's default width 5440, RoPE, GQA
# 16:4, untied, no biases; head dim 128) without / with --qk-layernorm (Qwen3's per-head q/k norms): the cost of the
# qk norms in a step (no anchor counterpart).
# 1.3b-ln / 1.3b-ln-mlp: the GPT 1.3B with --recompute-granularity selective --recompute-modules layernorm (+ mlp):
# the step time and peak memory of re-running the norms (and the MLPs) in backward; 1.3b-sel: Megatron's default
# selective recompute (core_attn: with flash attention only the softmax statistics are dropped, and the attention
# forward re-runs in backward).
# 1.3b-llama-mtp1 / 1.3b-llama-mtp2: 1.3b-llama with --mtp-num-layers 1 / 2 (DeepSeek-V3's multi-token prediction:
# each depth one more transformer layer, eh_proj and an LM head pass on the last stage; no anchor counterpart).
# 1.3b-llama-mla / 1.3b-llama-mha: the 1.3B Llama shapes with DeepSeek-V2-Lite's multi-latent attention (kv_lora_rank 512,
# no query compression, qk_head_dim 128 + qk_pos_emb_head_dim 64, v_head_dim 128: head dim 192 on cuDNN, values padded;
# latent norms; YaRN factor 40, mscale 0.707 / 0.707, original context 4096) and the same model with MHA (16 heads of
# 128, no GQA): the cost of MLA in a step (no anchor counterpart; the MFU column counts the MHA model's FLOPs).
# 124m-fp8 / 1.3b-fp8 (and -tw): the same runs with FP8 GEMMs in the dense linears (--fp8-format hybrid, delayed /
# tensorwise scaling; bench/gpu/fp8_step.sh runs them beside bf16); torch-fp8: the PyTorch FP8 anchor
# (../shared/anchors/torch_gpt_fp8.py: its bf16 and float8 runs of both shapes). -fp8-block: blockwise scaling
# (--fp8-format e4m3, DeepSeek-V3's recipe).
# 8b-slice (-fp8, -fp8-block): 4 Llama-3-8B-wide layers (d 4096, FFN 14336 SwiGLU, GQA 32:8, T 4096, B 2; vocab
# 50304), where the linears dominate and FP8 pays most; no anchor counterpart (the anchors are GPT-2 shaped).
# usage (device machine, repo root, device_carry/ carried):
#   bench/gpu/e2e_vs_torch.sh <out dir> [124m] [1.3b] [124m-graph] [1.3b-graph] [124m-zeroed] [1.3b-zeroed]
#     [124m-dropout] [1.3b-dropout] [1.3b-llama] [1.3b-qk] [1.3b-ln] [1.3b-ln-mlp] [1.3b-sel] [1.3b-llama-mtp1]
#     [1.3b-llama-mtp2] [1.3b-llama-mla] [1.3b-llama-mha] [124m-fp8] [1.3b-fp8] [124m-fp8-tw] [1.3b-fp8-tw]
#     [124m-fp8-block] [1.3b-fp8-block] [8b-slice] [8b-slice-fp8] [8b-slice-fp8-block] [torch] [torch-fp8]
set -u
OUT=$1
shift
what=${*:-124m 1.3b torch}
mkdir -p "$OUT"
. bench/gpu/env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 bench/gpu/random_tokens.py /tmp/rnd --tokens 4000000 --vocab 50304 --doc-len 8192

ours() {  # name L d h T B [extra flags]
  local name=$1 L=$2 d=$3 h=$4 T=$5 B=$6
  shift 6
  local drop="--hidden-dropout 0 --attention-dropout 0"
  case " $* " in *-dropout*) drop="" ;; esac  # the caller's dropout flags instead
  echo "== mcpp $name"
  CUDA_VISIBLE_DEVICES=${GPU:-0} "$MCPP" train --num-layers "$L" --hidden-size "$d" --num-attention-heads "$h" --seq-length "$T" \
    --max-position-embeddings "$T" --micro-batch-size "$B" --global-batch-size "$B" \
    --tokenizer-type NullTokenizer --vocab-size 50304 --make-vocab-size-divisible-by 128 \
    $drop --bf16 --device cuda --lr 1e-4 --lr-decay-style constant \
    --train-iters 40 --log-interval 1 --eval-iters 0 --data-path /tmp/rnd --split 100,0,0 \
    --metrics-path "$OUT/mcpp_$name.jsonl" "$@" 2>&1 | tee "$OUT/mcpp_$name.log" | grep -v '^  [a-z_]* \.\.\.'
  python3 - "$OUT/mcpp_$name.jsonl" "$name" "$L" "$d" "$T" "$B" <<'PY'
import json, sys
path, name, L, d, T, B = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
recs = [json.loads(l) for l in open(path)]
its = [r for r in recs if "tokens_per_sec" in r]
ms = sorted(r["elapsed_ms_per_iter"] for r in its if r["iteration"] > 10)  # 30 steps after 10 warm-up
if not ms:  # the run stopped before iteration 11 (its log has the error)
    print(json.dumps(dict(system="mcpp", name=name, error=f"no timed iterations ({len(its)} logged)")))
    sys.exit(0)
mem = [r for r in recs if r.get("event") == "memory"]
V = 50304
flops = 72 * B * T * L * d * d * (1 + T / (6 * d) + V / (16 * L * d))  # DESIGN.md's (mfu_989: the earlier figures)
# Megatron's num_floating_point_operations for plain GPT (MHA, GELU 4h; causal scores halved), the log line's formula
# (training/flops.h): 72 B T L d^2 (1 + T/(12 d) + V/(12 L d)). mfu_log: the median of the log line's MFU over the same
# iterations; for the plain-GPT shapes (124m, 1.3b and their variants) it equals mfu_megatron within 1%.
flops_megatron = 72 * B * T * L * d * d * (1 + T / (12 * d) + V / (12 * L * d))
step = ms[len(ms) // 2] / 1e3  # the median, as the anchor
mfus = sorted(r["mfu"] for r in its if r["iteration"] > 10 and "mfu" in r)
print(json.dumps(dict(system="mcpp", name=name, B=B, T=T, d=d, L=L, V=V, step_ms=round(step * 1e3, 2),
                      tok_s=round(B * T / step), mfu_989=round(flops / step / 989e12, 4),
                      mfu_megatron=round(flops_megatron / step / 989e12, 4),
                      mfu_log=round(mfus[len(mfus) // 2], 4) if mfus else None,
                      peak_gib=mem[-1]["peak_device_gib"] if mem else None, loss=its[-1]["lm_loss"],
                      steps=len(ms), mean_ms=round(sum(ms) / len(ms), 2), min_ms=round(ms[0], 2),
                      max_ms=round(ms[-1], 2))))
PY
}
LLAMA="--normalization RMSNorm --swiglu --position-embedding-type rope --untie-embeddings-and-output-weights
  --disable-bias-linear --group-query-attention --num-query-groups 4"
SLICE8B="--normalization RMSNorm --swiglu --position-embedding-type rope --untie-embeddings-and-output-weights
  --disable-bias-linear --group-query-attention --num-query-groups 8 --ffn-hidden-size 14336"
LLAMA_MHA="--normalization RMSNorm --swiglu --position-embedding-type rope --untie-embeddings-and-output-weights
  --disable-bias-linear"
MLA="--multi-latent-attention --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
  --qk-layernorm --rope-type yarn --rotary-scaling-factor 40 --mscale 0.707 --mscale-all-dim 0.707
  --original-max-position-embeddings 4096"
for w in $what; do
  case $w in
    124m) ours gpt2-124m 12 768 12 1024 32 ;;
    1.3b) ours gpt-1.3b 24 2048 16 2048 8 ;;
    124m-graph) ours gpt2-124m-graph 12 768 12 1024 32 --enable-cuda-graph ;;
    1.3b-graph) ours gpt-1.3b-graph 24 2048 16 2048 8 --enable-cuda-graph ;;
    124m-zeroed) ours gpt2-124m-zeroed 12 768 12 1024 32 --no-overwrite-main-grad ;;
    1.3b-zeroed) ours gpt-1.3b-zeroed 24 2048 16 2048 8 --no-overwrite-main-grad ;;
    124m-dropout) ours gpt2-124m-dropout 12 768 12 1024 32 --attention-dropout 0.1 --hidden-dropout 0.1 ;;
    1.3b-dropout) ours gpt-1.3b-dropout 24 2048 16 2048 8 --attention-dropout 0.1 --hidden-dropout 0.1 ;;
    1.3b-llama) ours gpt-1.3b-llama 24 2048 16 2048 8 $LLAMA ;;
    1.3b-qk) ours gpt-1.3b-qk 24 2048 16 2048 8 $LLAMA --qk-layernorm ;;
    1.3b-llama-mtp1) ours gpt-1.3b-llama-mtp1 24 2048 16 2048 8 $LLAMA --mtp-num-layers 1 ;;
    1.3b-llama-mtp2) ours gpt-1.3b-llama-mtp2 24 2048 16 2048 8 $LLAMA --mtp-num-layers 2 ;;
    1.3b-llama-mha) ours gpt-1.3b-llama-mha 24 2048 16 2048 8 $LLAMA_MHA ;;
    1.3b-llama-mla) ours gpt-1.3b-llama-mla 24 2048 16 2048 8 $LLAMA_MHA $MLA ;;
    1.3b-ln) ours gpt-1.3b-ln 24 2048 16 2048 8 --recompute-granularity selective --recompute-modules layernorm ;;
    1.3b-ln-mlp) ours gpt-1.3b-ln-mlp 24 2048 16 2048 8 --recompute-granularity selective \
                   --recompute-modules layernorm mlp ;;
    1.3b-sel) ours gpt-1.3b-sel 24 2048 16 2048 8 --recompute-granularity selective ;;
    124m-fp8) ours gpt2-124m-fp8 12 768 12 1024 32 --fp8-format hybrid --fp8-recipe delayed ;;
    1.3b-fp8) ours gpt-1.3b-fp8 24 2048 16 2048 8 --fp8-format hybrid --fp8-recipe delayed ;;
    124m-fp8-tw) ours gpt2-124m-fp8-tw 12 768 12 1024 32 --fp8-format hybrid --fp8-recipe tensorwise ;;
    1.3b-fp8-tw) ours gpt-1.3b-fp8-tw 24 2048 16 2048 8 --fp8-format hybrid --fp8-recipe tensorwise ;;
    124m-fp8-block) ours gpt2-124m-fp8-block 12 768 12 1024 32 --fp8-format e4m3 --fp8-recipe blockwise ;;
    1.3b-fp8-block) ours gpt-1.3b-fp8-block 24 2048 16 2048 8 --fp8-format e4m3 --fp8-recipe blockwise ;;
    8b-slice) ours llama-8b-slice 4 4096 32 4096 2 $SLICE8B ;;
    8b-slice-fp8) ours llama-8b-slice-fp8 4 4096 32 4096 2 $SLICE8B --fp8-format hybrid --fp8-recipe delayed ;;
    8b-slice-fp8-block) ours llama-8b-slice-fp8-block 4 4096 32 4096 2 $SLICE8B --fp8-format e4m3 --fp8-recipe blockwise ;;
    torch-fp8) echo "== pytorch fp8 anchor"; CUDA_VISIBLE_DEVICES=${GPU:-0} python3 "$C/anchors/torch_gpt_fp8.py" 124m 1.3b 2>&1 | tee "$OUT/torch_fp8.log" | grep '^{' ;;
    torch) echo "== pytorch anchor"; CUDA_VISIBLE_DEVICES=${GPU:-0} python3 "$C/anchors/torch_gpt.py" 124m 1.3b 2>&1 | tee "$OUT/torch.log" | grep '^{' ;;
  esac
done
