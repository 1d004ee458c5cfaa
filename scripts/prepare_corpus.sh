#!/usr/bin/env bash
# The default training corpus: Debian's fortunes (package fortunes / fortune-mod data) as a Megatron
# indexed dataset.
#   1. concatenates the fortune files of $FORTUNES_DIR (default /usr/share/games/fortunes; skipping the
#      .dat index files, the .u8 symlinks and any other symlink or directory) into $DATA_DIR/fortunes.txt,
#      one %-separated document per fortune;
#   2. runs `$MCPP data preprocess --append-eod` to write $DATA_DIR/fortunes_text_document.{bin,idx}.
# Idempotent: does nothing when both outputs exist and are newer than every input file.
# Environment: FORTUNES_DIR, DATA_DIR (default data), MCPP (default build/bin/mcpp), plus any
# tokenizer flags in PREPROCESS_FLAGS (e.g. "--vocab-file V --merge-file M").
# Prints the prefix to pass as --data-path.
set -euo pipefail
cd "$(dirname "$0")/.."
FORTUNES_DIR=${FORTUNES_DIR:-/usr/share/games/fortunes}
DATA_DIR=${DATA_DIR:-data}
MCPP=${MCPP:-build/bin/mcpp}
PREFIX="$DATA_DIR/fortunes"
OUT="${PREFIX}_text_document"

[[ -d "$FORTUNES_DIR" ]] || { echo "error: $FORTUNES_DIR not found (apt-get install fortunes)" >&2; exit 2; }
[[ -x "$MCPP" ]] || { echo "error: $MCPP not built (cmake --build build --target mcpp)" >&2; exit 2; }

inputs=()
while IFS= read -r -d '' f; do
  case "$f" in *.dat|*.u8) continue ;; esac
  inputs+=("$f")
done < <(find "$FORTUNES_DIR" -maxdepth 1 -type f -print0 | sort -z)  # -type f: no symlinks, no dirs
(( ${#inputs[@]} > 0 )) || { echo "error: no fortune files in $FORTUNES_DIR" >&2; exit 2; }

if [[ -f "$OUT.bin" && -f "$OUT.idx" ]]; then
  newer=$(find "${inputs[@]}" \( -newer "$OUT.idx" -o -newer "$OUT.bin" \) | head -n 1)
  if [[ -z "$newer" ]]; then
    echo "up to date: $OUT.{bin,idx} (${#inputs[@]} fortune files)"
    echo "use --data-path $OUT"
    exit 0
  fi
fi

mkdir -p "$DATA_DIR"
tmp="$PREFIX.txt.tmp"
: > "$tmp"
for f in "${inputs[@]}"; do
  cat "$f" >> "$tmp"
  [[ -z "$(tail -c 1 "$f")" ]] || echo >> "$tmp"  # end the last line
  echo "%" >> "$tmp"                               # a document boundary between files
done
mv "$tmp" "$PREFIX.txt"
echo "$PREFIX.txt: ${#inputs[@]} fortune files, $(wc -c < "$PREFIX.txt") bytes"
# shellcheck disable=SC2086
"$MCPP" data preprocess --input "$PREFIX.txt" --output-prefix "$PREFIX" --append-eod \
  --tokenizer-type GPT2BPETokenizer ${PREPROCESS_FLAGS:-}
