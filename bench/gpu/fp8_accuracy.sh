#!/bin/bash
# FP8 accuracy on real text (issue 35): GPT-2 124M (T 1024, micro/global batch 8, 1,000 iterations: 8.2 M tokens,
# under one epoch of the corpus) trained three times on the same data, seed and schedule: bf16, FP8 delayed scaling
# and FP8 tensorwise (--fp8-format hybrid). Data: device_carry/corpus.tar.xz, the GPT-2 BPE tokens of
# bench/gpu/text_corpus.py's corpus (Debian fortunes, Python's documentation sources, the Debian Reference and
# package changelogs; 14.0 M tokens) made on the build machine by bench/gpu/prepare_carry.sh.
# Schedule: lr 6e-4, 100 warm-up iterations, cosine to 6e-5, weight decay 0.1, clip 1.0 (nanoGPT's GPT-2 recipe);
# split 98,2,0; validation every 250 iterations over 20 batches. Prints one JSON line per run (final validation
# loss, the mean training loss of the last 50 iterations, step ms) and the verdict: the FP8 final validation loss
# within 1% of bf16's. Writes OUT/NAME.jsonl (the curves; bench/gpu/plot_curves.py draws them side by side).
# usage (device machine, repo root, device_carry/ carried): [RUNS='...'] bench/gpu/fp8_accuracy.sh OUT [ITERS]
set -u
OUT=$1 ITERS=${2:-1000}
mkdir -p "$OUT" /tmp/corpus
. bench/gpu/env.sh
tar xJf "$C/corpus.tar.xz" -C /tmp/corpus || { echo "error: device_carry/corpus.tar.xz missing"; exit 2; }
RUN_FLAGS="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024
  --tokenizer-type NullTokenizer --vocab-size 50304 --hidden-dropout 0 --attention-dropout 0 --bf16 --device cuda
  --micro-batch-size 8 --global-batch-size 8 --train-iters $ITERS --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine
  --lr-warmup-iters 100 --weight-decay 0.1 --clip-grad 1.0 --adam-beta2 0.95 --seed 1234 --log-interval 10
  --eval-interval 250 --eval-iters 20 --data-path /tmp/corpus/text_text_document --split 98,2,0"
for run in ${RUNS:-bf16 fp8_delayed fp8_tensorwise}; do  # RUNS: a subset (OUT may hold the others' .jsonl already)
  case $run in
    bf16) run_train bf16 1 ;;
    fp8_delayed) run_train fp8_delayed 1 --fp8-format hybrid --fp8-recipe delayed ;;
    fp8_tensorwise) run_train fp8_tensorwise 1 --fp8-format hybrid --fp8-recipe tensorwise ;;
    *) echo "error: RUNS: unknown run '$run' (bf16, fp8_delayed, fp8_tensorwise)"; exit 2 ;;
  esac
done
python3 - "$OUT" <<'PY'
import json, sys
sys.path.insert(0, "bench/gpu")
from run_metrics import records
out = sys.argv[1]
res = {}
for name in ["bf16", "fp8_delayed", "fp8_tensorwise"]:
    valid = records(out, name, "valid")
    train = [r for r in records(out, name) if "tokens_per_sec" in r]
    if not valid or not train:
        print(json.dumps({"name": name, "error": "no records"})); continue
    last = [r["lm_loss"] for r in train[-5:]]  # 5 log records of 10 iterations: the last 50
    ms = sorted(r["elapsed_ms_per_iter"] for r in train[1:])
    res[name] = valid[-1]["lm_loss"]
    print(json.dumps({"name": name, "iterations": train[-1]["iteration"], "valid_loss": round(valid[-1]["lm_loss"], 4),
                      "valid_curve": [round(r["lm_loss"], 4) for r in valid],
                      "train_loss_last50": round(sum(last) / len(last), 4), "step_ms_median": round(ms[len(ms) // 2], 2)}))
if "bf16" in res:
    for name in ["fp8_delayed", "fp8_tensorwise"]:
        if name in res:
            rel = res[name] / res["bf16"] - 1
            print(f"{name}: final validation loss {res[name]:.4f} vs bf16 {res['bf16']:.4f}: {rel * 100:+.2f}% "
                  f"({'PASS' if abs(rel) <= 0.01 else 'FAIL'}: within 1%)")
PY
