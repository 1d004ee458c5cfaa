#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan; tests/fuzz/CMakeLists.txt) into WORKDIR and runs
# each over its seeds (tests/fuzz/seeds/<target>) and committed corpus (tests/fuzz/corpus/<target>).
# usage: run_fuzz.sh WORKDIR smoke SECONDS      every target for SECONDS each (the `make test` smoke, ctest fuzz.parsers)
#        run_fuzz.sh WORKDIR long RUNS [TARGET] every target (or one) for RUNS executions (`make fuzz`: 10,000,000),
#                                               one at a time under nice -n 19; the grown corpus is merged (minimized)
#                                               back into tests/fuzz/corpus/<target>; counts go to WORKDIR/counts.txt
# FUZZ_MAX_TIME=<s> also bounds each long run by time (a starved machine: the counts say how far each got).
# FUZZ_TIMEOUT=<s> (default 10) is libFuzzer's per-input wall-clock bound; raise it only for runs on a shared,
# loaded machine, where a starved nice-19 process can stall past 10 s on any input (say so with the counts).
# A finding (crash, sanitizer report, an exception other than mcpp::Error, an input over FUZZ_TIMEOUT) fails the run
# and leaves libFuzzer's crash-* / timeout-* file in WORKDIR/<target>/. Without clang++ it exits 77 (ctest: skipped).
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$1"
MODE="${2:-smoke}"
AMOUNT="${3:-10}"
ONLY="${4:-}"
command -v clang++ >/dev/null || { echo "clang++ not found: fuzz targets not built"; exit 77; }
mkdir -p "$WORK"
if [ ! -f "$WORK/build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S "$SRC/tests/fuzz" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=None >"$WORK/cmake.log" 2>&1 \
    || { cat "$WORK/cmake.log"; exit 1; }
fi
# The long runs build at nice 19 as they run; the smoke (a test in `make test`) at the tests' priority: since the
# HF importers build the model's parameter list, mcpp_parsers compiles the packages up to models (~95 objects), which
# at nice 19 beside ctest's other tests starved past the test's timeout.
prio=0
[ "$MODE" = smoke ] || prio=19
nice -n $prio cmake --build "$WORK/build" -j "${FUZZ_JOBS:-2}" >"$WORK/build.log" 2>&1 || { tail -50 "$WORK/build.log"; exit 1; }
TARGETS=$(cd "$SRC/tests/fuzz" && ls *_fuzz.cpp | sed 's/\.cpp$//')
[ -n "$ONLY" ] && TARGETS="$ONLY"
for t in $TARGETS; do
  seeds="$SRC/tests/fuzz/seeds/${t%_fuzz}" corpus="$SRC/tests/fuzz/corpus/${t%_fuzz}"
  mkdir -p "$WORK/$t/new" "$corpus"
  cd "$WORK/$t"
  common=(-max_len=8192 -timeout="${FUZZ_TIMEOUT:-10}" -rss_limit_mb=4096 -print_final_stats=1)
  if [ "$MODE" = smoke ]; then
    "$WORK/build/$t" "${common[@]}" -max_total_time="$AMOUNT" new "$seeds" "$corpus" >log.txt 2>&1 \
      || { tail -40 log.txt; echo "FAIL: $t"; exit 1; }
  else
    nice -n 19 "$WORK/build/$t" "${common[@]}" -runs="$AMOUNT" -max_total_time="${FUZZ_MAX_TIME:-0}" new "$seeds" \
      "$corpus" >log.txt 2>&1 \
      || { tail -40 log.txt; echo "FAIL: $t"; exit 1; }
    # Minimize what this run grew into the committed corpus (inputs that add coverage over the seeds).
    mkdir -p merged && "$WORK/build/$t" -merge=1 -max_len=8192 merged "$corpus" new >merge.txt 2>&1
    rm -rf "$corpus" && mkdir -p "$corpus" && cp merged/* "$corpus"/ 2>/dev/null || true
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' log.txt | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' log.txt | tail -1 || true)
  echo "$t: $runs executions, $cov, corpus $(ls "$corpus" | wc -l) files" | tee -a "$WORK/counts.txt"
done
echo "fuzz ($MODE): OK"
