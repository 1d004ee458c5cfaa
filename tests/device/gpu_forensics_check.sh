#!/bin/bash
# Issue 33's forensics on 2 GPUs (kind nvidia-h200-x2 or nvidia-h100-x2; NCCL groups under mpirun), the small model:
#   tp2_badbatch  TP2, --check-data-consistency 1, --inject-fault bad-batch@2:1: the job ends, the error names
#                 iteration 2 and the tp group [0, 1] (the digests are taken on the host before the batch moves).
#   dp2_corrupt   DP2 --bf16, --flight-recorder-checksums, corrupt-collective@2:1 (rank 1's next shared result,
#                 a device tensor, gets a bit flipped through a host copy) + hang@3:0 (MCPP_DISTRIBUTED_TIMEOUT_SECONDS
#                 10: the watchdog dumps): `mcpp debug hang --json` reports result_mismatch at iteration 2 with both
#                 ranks named (2 members: no majority) and culprit rank 0. Healthy NCCL results before it agree.
#   dp2_sigusr1   DP2 --bf16, --flight-recorder-checksums, hang@3:1 (timeout 120 s): SIGUSR1 to mpirun once rank 1
#                 hangs; both ranks dump with reason SIGUSR1 and a captured main-thread stack; `mcpp debug hang`
#                 names rank 1 (its stack in FaultInjector::begin_step) and reports no result mismatch.
# Exit 1 on any failure. usage (repo root, device_carry/ carried): tests/device/gpu_forensics_check.sh OUT
set -u
OUT=${1:?usage: gpu_forensics_check.sh OUT}
mkdir -p "$OUT"
. bench/gpu/env.sh
make_rnd_small
RUN_FLAGS="--num-layers 2 $SMALL_MODEL"
ok=1

run_train tp2_badbatch 2 --tensor-model-parallel-size 2 --check-data-consistency 1 --inject-fault bad-batch@2:1
grep -q "check-data-consistency: iteration 2: the tp group \[0, 1\]" "$OUT/tp2_badbatch.log" \
  && echo "tp2_badbatch: OK" || { echo "tp2_badbatch: BAD"; grep ^error "$OUT/tp2_badbatch.log" | head -2; ok=0; }

mkdir -p "$OUT/corrupt"
MCPP_DISTRIBUTED_TIMEOUT_SECONDS=10 timeout 300 $MPIRUN -np 2 "$MCPP" train $RUN_FLAGS --bf16 \
  --metrics-path "$OUT/corrupt/m.jsonl" --flight-recorder-checksums --inject-fault corrupt-collective@2:1 \
  --inject-fault hang@3:0 > "$OUT/dp2_corrupt.log" 2>&1
"$MCPP" debug hang "$OUT/corrupt" --json > "$OUT/dp2_corrupt.json" 2>&1
"$MCPP" debug hang "$OUT/corrupt" > "$OUT/dp2_corrupt.txt" 2>&1

mkdir -p "$OUT/sigusr1"
MCPP_DISTRIBUTED_TIMEOUT_SECONDS=120 $MPIRUN -np 2 "$MCPP" train $RUN_FLAGS --bf16 \
  --metrics-path "$OUT/sigusr1/m.jsonl" --flight-recorder-checksums --inject-fault hang@3:1 \
  > "$OUT/dp2_sigusr1.log" 2>&1 &
PID=$!
for _ in $(seq 300); do grep -q "hang@3:1: this rank stops" "$OUT/dp2_sigusr1.log" && break; sleep 0.5; done
sleep 3
kill -USR1 $PID
for _ in $(seq 60); do [ -f "$OUT/sigusr1/flight_recorder/rank_0.json" ] && [ -f "$OUT/sigusr1/flight_recorder/rank_1.json" ] && break; sleep 0.5; done
sleep 1
kill -TERM $PID; sleep 3; kill -KILL $PID 2>/dev/null; wait $PID 2>/dev/null
"$MCPP" debug hang "$OUT/sigusr1" --json > "$OUT/dp2_sigusr1.json" 2>&1
"$MCPP" debug hang "$OUT/sigusr1" > "$OUT/dp2_sigusr1.txt" 2>&1
cat "$OUT/dp2_sigusr1.txt" | head -60

PYTHONPATH=tests/device python3 - "$OUT" <<'PY' || ok=0
import json, sys
out = sys.argv[1]
from verdicts import check, passed
def load(n):
    try:
        return json.load(open(f"{out}/{n}.json"))
    except (OSError, ValueError) as e:
        print(f"{n}: no report ({e})")
        return {}
c = load("dp2_corrupt")
mm = c.get("result_mismatch") or {}
check("dp2_corrupt", mm.get("iteration") == 2 and mm.get("differing_ranks") == [0, 1], f"result_mismatch {mm}")
check("dp2_corrupt", c.get("culprit_rank") == 0, f"culprit {c.get('culprit_rank')}")
s = load("dp2_sigusr1")
st = s.get("host_stacks", {})
own = [f for f in st.get("1", []) if f.endswith("(mcpp)")]
check("dp2_sigusr1", s.get("culprit_rank") == 1, f"culprit {s.get('culprit_rank')}")
check("dp2_sigusr1", sorted(st) == ["0", "1"] and own and own[0].startswith("mcpp::FaultInjector::begin_step("),
      f"stacks of {sorted(st)}; rank 1's innermost mcpp frame {own[:1]}")
check("dp2_sigusr1", "result_mismatch" in s and s["result_mismatch"] is None,
      f"healthy NCCL results agree: {s.get('result_mismatch', 'absent')}")
sys.exit(0 if passed() else 1)
PY
[ $ok = 1 ] && echo "gpu forensics checks passed" || { echo "gpu forensics checks FAILED"; exit 1; }
