#!/bin/bash
# Every 2-GPU device check in one call (kind nvidia-h200-x2), for the end of a change: the CUDA op / model
# suite on GPU 0 (mcpp_tests 'Cuda*:Gemm*'), the NCCL communicator suite on both GPUs (nccl_driver, incl. the
# comm-stream device timing), then tests/device/gpu_parallel_check.sh, gpu_timeline_check.sh and
# gpu_llama_check.sh. Prints one line per part and exits 1 if any failed; logs under OUT.
# Needs device_carry/ from `bench/gpu/make_carry.sh build-cuda mcpp mcpp_tests nccl_driver` (~6 min).
# usage (repo root): tests/device/run_x2.sh OUT
set -u
OUT=${1:?usage: run_x2.sh OUT}
mkdir -p "$OUT"
. bench/gpu/env.sh > /dev/null
rc=0
part() {  # part NAME PASS_REGEX COMMAND...: runs COMMAND > OUT/NAME.log, then greps the log for PASS_REGEX
  local name=$1 pass=$2
  shift 2
  "$@" > "$OUT/$name.log" 2>&1
  sed -i 's/\x1b\[[0-9;]*m//g' "$OUT/$name.log"  # gtest's colours
  if grep -qE "$pass" "$OUT/$name.log" && ! grep -qE '^\[  FAILED  \]' "$OUT/$name.log"; then
    echo "$name: OK ($(grep -E "$pass" "$OUT/$name.log" | tail -1))"
  else
    echo "$name: FAILED"; grep -E "FAILED|Failure|BAD|error" "$OUT/$name.log" | head -5; rc=1
  fi
}
GTEST_OK='^\[  PASSED  \] [0-9]+ tests'
part cuda_tests "$GTEST_OK" env CUDA_VISIBLE_DEVICES=0 "$C/bin/mcpp_tests" --gtest_filter='Cuda*:Gemm*'
part nccl_driver "$GTEST_OK" $MPIRUN -np 2 "$C/bin/nccl_driver"
part parallel 'GPU PARALLEL EQUIVALENCE OK' bash tests/device/gpu_parallel_check.sh "$OUT/par"
part timeline 'GPU TIMELINE COLLECTIVES OK' bash tests/device/gpu_timeline_check.sh "$OUT/tl"
part llama 'GPU LLAMA EQUIVALENCE OK' bash tests/device/gpu_llama_check.sh "$OUT/ll"
echo "RUN_X2 $([ $rc -eq 0 ] && echo OK || echo FAILED)"
exit $rc
