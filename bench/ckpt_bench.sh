#!/usr/bin/env bash
# Checkpoint benchmark (issue 5): save / load bandwidth, training pause of a sync vs an --async-save
# save, and read amplification of a reshard (offline `mcpp ckpt convert` TP1 -> TP2 and TP2 -> TP1).
#
# One process, fp32 GPT (GPT-2 BPE vocab), Adam state included (checkpoint = 3 x 4 bytes per parameter).
# Runs (each `mcpp train` does 3 iterations of micro batch 1 x seq SEQ; checkpoints at 2 and 3):
#   sync:  --save-interval 2            pause = the whole save (snapshot + write + fsync + commit)
#   async: --save-interval 2 --async-save  pause = the snapshot copy (+ staging-dir broadcast); the write
#          runs during iteration 3; its step time is reported next to the sync run's
#   load:  --load the sync checkpoint, 1 more iteration: load time and bytes read (checksums on)
#   reshard: ckpt convert --tp 2 (from TP1) and back --tp 1: bytes read / bytes written (= needed)
# Bandwidth = checkpoint bytes / time; the page cache is warm (the file system here is one virtual
# disk shared with other users), so these are upper bounds of what a cold read would see.
#
# Usage: bench/ckpt_bench.sh [MCPP_BIN]; env LAYERS (12) HIDDEN (768) HEADS (12) SEQ (64) THREADS (2)
# Output: one JSON object (also written to $OUT if set) and a summary table.
set -euo pipefail
cd "$(dirname "$0")/.."
MCPP=${1:-build/bin/mcpp}
LAYERS=${LAYERS:-12} HIDDEN=${HIDDEN:-768} HEADS=${HEADS:-12} SEQ=${SEQ:-64} THREADS=${THREADS:-2}
[[ -x $MCPP ]] || { echo "error: $MCPP is not an executable (build first)" >&2; exit 2; }
export OMP_NUM_THREADS=$THREADS
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ckpt_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

python3 - "$tmp/corpus.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(400):
        f.write(json.dumps({"text": f"Record {i}: the quick brown fox {i % 13} jumps over the lazy dog {i % 7}."}) + "\n")
PY
"$MCPP" data preprocess --input "$tmp/corpus.jsonl" --output-prefix "$tmp/c" --append-eod > /dev/null
M=(--num-layers "$LAYERS" --hidden-size "$HIDDEN" --num-attention-heads "$HEADS" --seq-length "$SEQ"
   --max-position-embeddings "$SEQ" --micro-batch-size 1 --global-batch-size 1 --lr 1e-4 --lr-warmup-iters 1 --lr-decay-iters 10
   --log-interval 1 --eval-interval 1000000 --eval-iters 0 --split 100,0,0 --hidden-dropout 0
   --attention-dropout 0 --make-vocab-size-divisible-by 64 --data-path "$tmp/c_text_document" --seed 1)

# `sync` between runs: the next run must not pay for the previous one's dirty-page write-back (at 0.5 B
# parameters that is 13 GB of page cache, and allocations stall on reclaim).
sync
"$MCPP" train "${M[@]}" --train-iters 3 --save-interval 2 --save "$tmp/sync" > "$tmp/sync.log" 2>&1
sync
"$MCPP" train "${M[@]}" --train-iters 3 --save-interval 2 --save "$tmp/async" --async-save > "$tmp/async.log" 2>&1
sync
"$MCPP" train "${M[@]}" --train-iters 4 --load "$tmp/sync" > "$tmp/load.log" 2>&1
"$MCPP" ckpt convert "$tmp/sync" --tp 2 --pp 1 --output "$tmp/tp2" > "$tmp/conv_tp2.log" 2>&1
"$MCPP" ckpt convert "$tmp/tp2" --tp 1 --pp 1 --output "$tmp/tp1" > "$tmp/conv_tp1.log" 2>&1
"$MCPP" ckpt info "$tmp/sync" > "$tmp/info.txt"

python3 - "$tmp" "$LAYERS" "$HIDDEN" "$SEQ" <<'PY'
import json, os, re, sys
tmp, layers, hidden, seq = sys.argv[1], *map(int, sys.argv[2:])
def recs(d):
    return [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
def du(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
sync, asyn = recs(os.path.join(tmp, "sync")), recs(os.path.join(tmp, "async"))
ck_bytes = du(os.path.join(tmp, "sync", "iter_0000002"))
info = open(os.path.join(tmp, "info.txt")).read()
params = int(re.search(r"model (\d+)", info).group(1)) // 4
s_save = next(r for r in sync if r.get("event") == "save" and r["iteration"] == 2)
a_start = next(r for r in asyn if r.get("event") == "save_start" and r["iteration"] == 2)
a_save = next(r for r in asyn if r.get("event") == "save" and r["iteration"] == 2)
step3 = lambda rs: next(r["elapsed_ms_per_iter"] for r in rs if r.get("event") == "train" and r["iteration"] == 3)
step2 = lambda rs: next(r["elapsed_ms_per_iter"] for r in rs if r.get("event") == "train" and r["iteration"] == 2)
load = re.search(r"in ([0-9.]+) ms \((\d+) bytes read", open(os.path.join(tmp, "load.log")).read())
def conv(name):
    m = re.search(r"(\d+) bytes read, (\d+) bytes written", open(os.path.join(tmp, name)).read())
    return int(m.group(1)), int(m.group(2))
r2, w2 = conv("conv_tp2.log")
r1, w1 = conv("conv_tp1.log")
out = {
    "params": params, "layers": layers, "hidden": hidden, "checkpoint_bytes": ck_bytes,
    "sync_save_ms": s_save["ms"], "sync_pause_ms": s_save["pause_ms"],
    "sync_save_MBps": ck_bytes / 1e6 / (s_save["ms"] / 1e3),
    "async_pause_ms": a_start["pause_ms"], "async_commit_ms": a_save["ms"],
    "async_write_MBps": ck_bytes / 1e6 / (a_save["ms"] / 1e3),
    "step_ms_plain": step2(sync), "step_ms_during_async_write": step3(asyn), "step_ms_after_sync_save": step3(sync),
    "load_ms": float(load.group(1)), "load_bytes_read": int(load.group(2)),
    "load_MBps": int(load.group(2)) / 1e6 / (float(load.group(1)) / 1e3),
    "reshard_tp1_to_tp2_read_amplification": r2 / w2, "reshard_tp2_to_tp1_read_amplification": r1 / w1,
}
print(json.dumps(out))
if os.environ.get("OUT"):
    open(os.environ["OUT"], "w").write(json.dumps(out) + "\n")
print(f"""
model {params/1e6:.1f} M params, checkpoint {ck_bytes/1e6:.1f} MB (model + Adam m, v; fp32)
| measure | value |
|---|---|
| sync save (pause = whole save) | {s_save['ms']:.0f} ms, {out['sync_save_MBps']:.0f} MB/s |
| async save pause (snapshot) | {a_start['pause_ms']:.0f} ms ({s_save['ms']/a_start['pause_ms']:.1f}x shorter) |
| async: snapshot to commit (write in background, commit at the next step boundary) | {a_save["ms"]:.0f} ms |
| training step: plain / during async write / after sync save | {out['step_ms_plain']:.0f} / {out['step_ms_during_async_write']:.0f} / {out['step_ms_after_sync_save']:.0f} ms |
| load (same layout, checksums on) | {out['load_ms']:.0f} ms, {out['load_MBps']:.0f} MB/s |
| read amplification TP1 -> TP2 (convert) | {out['reshard_tp1_to_tp2_read_amplification']:.2f} |
| read amplification TP2 -> TP1 (convert) | {out['reshard_tp2_to_tp1_read_amplification']:.2f} |""")
PY
