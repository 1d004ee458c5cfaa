#!/usr/bin/env bash
# `make bench`: the CPU benchmarks behind docs/PERF.md, in one run.
#   1. Google Benchmark micro-benchmarks (short --benchmark_min_time): demo_step_bench (every op of the demo
#      step at its exact shapes), cpu_ops_bench (GPT-2-small shapes), attention_bench (flash attention, CE).
#   2. bench/e2e_cpu.sh: end-to-end training step of the demo model, ours vs PyTorch CPU, interleaved.
# Prints the machine line (CPU model, cores, load average, commit, date) PERF.md records with each figure.
# Env: BUILD (build), THREADS (2), MIN_TIME (0.1 s per benchmark), ROUNDS/STEPS/WARMUP (see e2e_cpu.sh),
#      SKIP_MICRO=1 to run only the end-to-end comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build} THREADS=${THREADS:-2} MIN_TIME=${MIN_TIME:-0.1}
export OMP_NUM_THREADS=$THREADS
# Passive OpenMP waiting (workers sleep instead of spinning between parallel regions) for ours and torch alike:
# on a shared machine a spinning worker whose partner was preempted burns the core it waits for, which made
# active-wait figures swing 2-5x with the load average. Override with OMP_WAIT_POLICY=active.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

machine() {
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores | load average:$(uptime | sed 's/.*load average://')"
}
echo "== commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src bench 2>/dev/null || echo ' (+ local changes)') | $(date -u '+%Y-%m-%d %H:%M UTC') | threads $THREADS | OMP_WAIT_POLICY=$OMP_WAIT_POLICY"
machine

if [[ ${SKIP_MICRO:-0} != 1 ]]; then
  for b in demo_step_bench cpu_ops_bench attention_bench; do
    exe=$BUILD/bin/$b
    [[ -x $exe ]] || { echo "error: $exe not built (make build, or cmake --build $BUILD --target $b)" >&2; exit 2; }
    echo; echo "== $b (min time ${MIN_TIME}s per benchmark)"
    "$exe" --benchmark_min_time="$MIN_TIME" 2>&1 | grep -vE '^(\*\*\*WARNING|Run on|CPU Caches|  L[123]|Load Average|[0-9-]+T[0-9:]+)'
  done
fi

echo; echo "== end to end: demo model training step, mcpp vs PyTorch CPU (interleaved)"
machine
THREADS=$THREADS bash bench/e2e_cpu.sh "$BUILD/bin/mcpp"
machine
