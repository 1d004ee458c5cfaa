#!/usr/bin/env bash
# Pipeline bubble and activation memory of `mcpp train` on CPU ranks: PP2 / PP4 x M = 1 / 4 / 16
# microbatches (1F1B), PP4 with V = 2 virtual stages (interleaved; Megatron requires pp > 2 for it), and
# PP4 M16 with full recompute (uniform, 1 layer per group: "rc" suffix), with --timeline.
#
# Model: GPT-2 style, hidden 64, 4 heads, seq 64, micro-batch 1, a SMALL vocabulary (NullTokenizer,
# --vocab-size 256, padded to 256) so the last stage's LM head + loss does not dominate; 8 layers (PP2:
# 4 per stage, PP4: 2, V2 at PP4: 1 per virtual stage). Data: random token ids written here as a Megatron
# indexed dataset (MMIDIDX, int32). Every rank runs OMP_NUM_THREADS=1; PP4 on the 2-core box is
# oversubscribed 2x (two ranks per core): its F/B intervals include time the core was given to the
# other rank, which shows up as compute, not as bubble — read those rows with that in mind.
# Per layout: ITERS iterations; the bubble report (measured per stage vs (pp-1)/(V*M+pp-1)) and the
# activation-memory report (in-flight contexts, peak bytes) come from the run's metrics JSONL. Output: a
# markdown table on stdout (docs/PERF.md), progress on stderr.
#
# Usage: bench/pp_bubble.sh [MCPP_BIN] ; env: ITERS (3) PYTHON (/usr/bin/python3) LAYOUTS (all)
set -euo pipefail
cd "$(dirname "$0")/.."
MCPP=${1:-build/bin/mcpp}
ITERS=${ITERS:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
LAYOUTS=${LAYOUTS:-"pp2m1 pp2m4 pp2m16 pp4m1 pp4m4 pp4m16 pp4m4v2 pp4m8v2 pp4m16v2 pp4m16rc"}
[[ -x $MCPP ]] || { echo "error: $MCPP is not an executable (build first)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
VOCAB=256 HIDDEN=${HIDDEN:-256} SEQ=${SEQ:-128}
"$PYTHON" - "$tmp/data" "$VOCAB" <<'PY'
import struct, sys
import numpy as np
prefix, vocab = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
docs = [rng.integers(0, vocab - 1, size=int(n), dtype=np.int32) for n in rng.integers(50, 400, size=400)]
with open(prefix + ".bin", "wb") as f:
    for d in docs:
        f.write(d.tobytes())
sizes = np.array([len(d) for d in docs], dtype=np.int32)
pointers = np.concatenate([[0], np.cumsum(sizes[:-1].astype(np.int64) * 4)]).astype(np.int64)
with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, len(docs), len(docs) + 1))
    f.write(sizes.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())
PY

echo "| layout | ranks | M | V | theoretical bubble | measured bubble per stage | step ms (last) | in flight per stage | peak activation KiB per stage | per-mb KiB per stage |"
echo "|---|---:|---:|---:|---:|---|---:|---|---|---|"
for layout in $LAYOUTS; do
  [[ $layout =~ ^pp([0-9]+)m([0-9]+)(v([0-9]+))?(rc)?$ ]] || { echo "error: bad layout $layout" >&2; exit 2; }
  pp=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} v=${BASH_REMATCH[4]:-1} rc=${BASH_REMATCH[5]}
  flags=(--pipeline-model-parallel-size "$pp")
  [[ -n $rc ]] && flags+=(--recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
  ((v > 1)) && flags+=(--num-layers-per-virtual-pipeline-stage $((8 / (pp * v))))
  echo "running $layout (np $pp, M $m, V $v)" >&2
  mpiexec --allow-run-as-root --oversubscribe -np "$pp" -x OMP_NUM_THREADS \
    "$MCPP" train --num-layers 8 --hidden-size "$HIDDEN" --num-attention-heads 8 --seq-length "$SEQ" \
    --max-position-embeddings "$SEQ" --tokenizer-type NullTokenizer --vocab-size "$VOCAB" \
    --make-vocab-size-divisible-by 128 --micro-batch-size 1 --global-batch-size "$m" --lr 1e-3 \
    --lr-warmup-iters 1 --train-iters "$ITERS" --log-interval 1 --eval-iters 0 --eval-interval 1000000 \
    --split 100,0,0 --data-path "$tmp/data" --hidden-dropout 0 --attention-dropout 0 "${flags[@]}" \
    --timeline "$tmp/$layout.trace.json" --metrics-path "$tmp/$layout.jsonl" > "$tmp/$layout.log" 2>&1 \
    || { cat "$tmp/$layout.log" >&2; exit 1; }
  "$PYTHON" - "$tmp/$layout.jsonl" "$layout" "$pp" "$m" "$v" "${rc:-none}" <<'PY'
import json, sys
path, layout, pp, m, v, rc = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6]
recs = [json.loads(l) for l in open(path)]
bubble = [r for r in recs if r.get("event") == "pipeline_bubble"][-1]
mem = [r for r in recs if r.get("event") == "pipeline_activation_memory"][-1]
train = [r for r in recs if r.get("event") == "train"]
measured = " / ".join(f"{s['measured']:.2f}" for s in bubble["stages"])
flight = " / ".join(str(s["in_flight"]) for s in mem["stages"])
peak = " / ".join(f"{s['peak_bytes'] / 1024:.0f}" for s in mem["stages"])
per = " / ".join(f"{s['context_bytes'] / 1024:.0f}" for s in mem["stages"])
print(f"| PP{pp} M{m}{' V' + str(v) if v > 1 else ''}{' + full recompute' if rc == 'rc' else ''} | {pp} | {m} | {v} | {bubble['theoretical']:.3f} | {measured} | "
      f"{train[-1]['elapsed_ms_per_iter']:.0f} | {flight} | {peak} | {per} |")
PY
done
