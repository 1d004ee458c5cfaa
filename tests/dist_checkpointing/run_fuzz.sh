#!/usr/bin/env bash
# Builds tests/dist_checkpointing/manifest_fuzz.cpp with clang + libFuzzer (ASan, UBSan with no
# recovery) against the parser sources only, and runs it for a bounded time on the seed corpus
# tests/dist_checkpointing/fuzz_corpus (manifest JSON v1/v2 and a safetensors file). Without clang++
# it reports that and exits 0 (ctest marks it skipped via SKIP_RETURN_CODE 77).
# usage: run_fuzz.sh WORKDIR SECONDS
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$1"
SECS="${2:-30}"
command -v clang++ >/dev/null || { echo "clang++ not found: fuzz target not built"; exit 77; }
mkdir -p "$WORK/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I "$SRC/src" -I "$SRC" "$SRC/tests/dist_checkpointing/manifest_fuzz.cpp" \
  "$SRC/src/mcpp/dist_checkpointing/manifest.cpp" "$SRC/src/mcpp/dist_checkpointing/safetensors.cpp" \
  "$SRC/src/mcpp/dist_checkpointing/fault_injection.cpp" "$SRC/src/mcpp/core/dtype.cpp" \
  "$SRC/src/mcpp/core/tensor.cpp" "$SRC/src/mcpp/core/device_memory.cpp" \
  "$SRC/src/mcpp/kernels/cuda_stub/cuda_stub.cpp" -lfmt -lxxhash -o "$WORK/manifest_fuzz"
cd "$WORK"
./manifest_fuzz -max_total_time="$SECS" -max_len=4096 -timeout=10 corpus "$SRC/tests/dist_checkpointing/fuzz_corpus"
