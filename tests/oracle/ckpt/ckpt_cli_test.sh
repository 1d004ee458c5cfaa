#!/usr/bin/env bash
# End-to-end test of `mcpp ckpt` against the independent Python oracle (read_safetensors.py):
#   python makes a random HF model (gpt2: F32 single file; llama: BF16, GQA, untied, 2 shards; mixtral: F16,
#   4 experts top-2, 2 shards; qwen3: llama's with q/k norms and head_dim 8 != hidden / heads)
#   -> mcpp ckpt import -> oracle checks manifest/files/xxh3 and the layout rearrangement in numpy
#   -> mcpp ckpt verify / info -> mcpp ckpt export -> oracle checks the HF tensors against the
#   checkpoint (numpy transposes/splits) and against the original HF tensors
#   -> a flipped byte makes `mcpp ckpt verify` exit 2 naming the tensor; a format mismatch on export
#   exits 2 naming the config field; re-importing into the same save dir is refused; the imported Mixtral
#   fine-tunes with --finetune (without it: an error naming the flag), also with --use-checkpoint-args instead of
#   the model flags (the same losses); the imported Qwen3 fine-tunes with --use-checkpoint-args.
# usage: ckpt_cli_test.sh MCPP_BIN PYTHON WORKDIR
set -euo pipefail
MCPP=$1; PY=$2; W=$3
ORACLE="$(dirname "$0")/read_safetensors.py"
rm -rf "$W"; mkdir -p "$W"

expect_fail() {  # expect_fail "text that stderr must contain" cmd...
  local want=$1; shift
  set +e
  "$@" >"$W/out.txt" 2>"$W/err.txt"
  local rc=$?
  set -e
  if [ "$rc" -ne 2 ]; then echo "FAIL: expected exit 2, got $rc from: $*"; cat "$W/err.txt"; exit 1; fi
  if ! grep -qF -- "$want" "$W/err.txt"; then echo "FAIL: stderr lacks '$want':"; cat "$W/err.txt"; exit 1; fi
  echo "ok (exit 2, names '$want'): $*"
}

for fmt in gpt2 llama mixtral qwen3; do
  "$PY" "$ORACLE" make-hf $fmt "$W/hf_$fmt"
  "$MCPP" ckpt import --input "$W/hf_$fmt" --format hf-$fmt --save "$W/ck_$fmt"
  test "$(cat "$W/ck_$fmt/latest_checkpointed_iteration.txt")" = "0"
  "$PY" "$ORACLE" check-ckpt "$W/ck_$fmt/iter_0000000"
  "$PY" "$ORACLE" check-import $fmt "$W/hf_$fmt" "$W/ck_$fmt/iter_0000000"
  "$MCPP" ckpt verify --load "$W/ck_$fmt"
  "$MCPP" ckpt info --load "$W/ck_$fmt" --tensors > "$W/info.txt"  # no pipe into head: SIGPIPE + pipefail
  head -5 "$W/info.txt"
  grep -q "decoder.final_layernorm.weight" "$W/info.txt"
  "$MCPP" ckpt export --load "$W/ck_$fmt/iter_0000000" --format hf-$fmt --output "$W/out_$fmt"
  "$PY" "$ORACLE" check-export $fmt "$W/ck_$fmt/iter_0000000" "$W/out_$fmt" "$W/hf_$fmt"
  expect_fail "refusing to overwrite" "$MCPP" ckpt import --input "$W/hf_$fmt" --format hf-$fmt --save "$W/ck_$fmt"
done

expect_fail "model.normalization" "$MCPP" ckpt export --load "$W/ck_llama" --format hf-gpt2 --output "$W/bad"
expect_fail "model_type" "$MCPP" ckpt import --input "$W/hf_gpt2" --format hf-llama --save "$W/bad"
expect_fail "num_moe_experts" "$MCPP" ckpt export --load "$W/ck_mixtral" --format hf-llama --output "$W/bad"
expect_fail "num_moe_experts" "$MCPP" ckpt export --load "$W/ck_llama" --format hf-mixtral --output "$W/bad"
expect_fail "model.qk_layernorm" "$MCPP" ckpt export --load "$W/ck_qwen3" --format hf-llama --output "$W/bad"
expect_fail "model.qk_layernorm" "$MCPP" ckpt export --load "$W/ck_llama" --format hf-qwen3 --output "$W/bad"

# The imported Mixtral fine-tunes (--finetune: its weights, a fresh schedule); without --finetune the model-only
# checkpoint is an error naming the flag. With --use-checkpoint-args the architecture comes from the checkpoint: the
# same losses without any model flag, and over a contradicting --hidden-size; without --load it is a named error.
"$PY" "$(dirname "$0")/../../../bench/gpu/random_tokens.py" "$W/rnd" --tokens 20000 --vocab 130 --doc-len 64
RUN=(train --load "$W/ck_mixtral" --tokenizer-type NullTokenizer --vocab-size 130 --seq-length 16
     --micro-batch-size 2 --global-batch-size 4 --lr 1e-3 --train-iters 2 --log-interval 1 --eval-iters 0
     --data-path "$W/rnd" --split 100,0,0 --hidden-dropout 0 --attention-dropout 0)
ARCH=(--num-layers 2 --hidden-size 16 --num-attention-heads 4 --group-query-attention --num-query-groups 2
      --kv-channels 4 --ffn-hidden-size 24 --max-position-embeddings 64 --normalization RMSNorm --norm-epsilon 1e-6
      --swiglu --position-embedding-type rope --rotary-base 500000 --untie-embeddings-and-output-weights
      --disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 24)
expect_fail "--finetune" "$MCPP" "${RUN[@]}" "${ARCH[@]}" --save "$W/ft"
"$MCPP" "${RUN[@]}" "${ARCH[@]}" --finetune --save "$W/ft" > "$W/ft.txt" 2>&1
if ! grep -q "training done: 2 iterations run" "$W/ft.txt"; then
  echo "FAIL: the imported Mixtral did not fine-tune"; tail -5 "$W/ft.txt"; exit 1
fi
echo "ok: the imported Mixtral fine-tuned 2 iterations"
"$MCPP" "${RUN[@]}" --finetune --use-checkpoint-args --save "$W/ft_args" > "$W/ft_args.txt" 2>&1
"$MCPP" "${RUN[@]}" --finetune --use-checkpoint-args --hidden-size 32 --save "$W/ft_args2" > "$W/ft_args2.txt" 2>&1
"$PY" - "$W/ft" "$W/ft_args" "$W/ft_args2" <<'PY'
import json, sys
def losses(d):
    return [r["lm_loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if r.get("event") == "train"]
ref = losses(sys.argv[1])
for d in sys.argv[2:]:
    assert len(ref) == 2 and losses(d) == ref, f"--use-checkpoint-args: {d} losses {losses(d)} vs {ref}"
print("ok: --use-checkpoint-args trains the checkpoint's architecture (the same losses)")
PY
Q=("${RUN[@]}")
Q[2]="$W/ck_qwen3"  # the imported Qwen3 (q/k norms, head dim 8 over hidden 16) fine-tunes from its stored config
"$MCPP" "${Q[@]}" --finetune --use-checkpoint-args --save "$W/ft_qwen3" > "$W/ft_qwen3.txt" 2>&1
if ! grep -q "training done: 2 iterations run" "$W/ft_qwen3.txt"; then
  echo "FAIL: the imported Qwen3 did not fine-tune"; tail -5 "$W/ft_qwen3.txt"; exit 1
fi
echo "ok: the imported Qwen3 fine-tuned 2 iterations"
expect_fail "--use-checkpoint-args needs --load" "$MCPP" train --use-checkpoint-args --data-path "$W/rnd" \
  --tokenizer-type NullTokenizer --vocab-size 130

# A flipped byte inside one tensor: verify names that tensor and exits 2; the others stay OK.
KEY=decoder.layers.1.mlp.linear_fc2.weight
"$PY" "$ORACLE" flip "$W/ck_gpt2/iter_0000000" $KEY
expect_fail "$KEY" "$MCPP" ckpt verify --load "$W/ck_gpt2"
grep -qF "checksum mismatch" "$W/err.txt"
test "$(grep -c '^BAD ' "$W/err.txt")" = "1"
expect_fail "$KEY" "$MCPP" ckpt export --load "$W/ck_gpt2" --format hf-gpt2 --output "$W/bad"
if "$PY" "$ORACLE" check-ckpt "$W/ck_gpt2/iter_0000000" 2>/dev/null; then
  echo "FAIL: the oracle missed the flipped byte"; exit 1
fi
rm "$W/ck_llama/iter_0000000/manifest.json"
expect_fail "manifest.json" "$MCPP" ckpt verify --load "$W/ck_llama"
echo "ckpt_cli_test: all passed"
rm -rf "$W"
