#!/usr/bin/env bash
# HuggingFaceTokenizer on a real vocabulary against Hugging Face `tokenizers` (npm, the Rust library):
#   hf_oracle_test.sh MCPP TOKENIZER_DIR WORKDIR NAME BYTES
# The text: the first ~BYTES of the fortunes corpus (when installed), the committed multilingual texts and 30000
# seeded random code points of many scripts, whitespace kinds and emoji. `mcpp tokenize` must give the oracle's
# ids, and `mcpp tokenize --decode` its decode of them. Exit 77 (skipped) without node or the npm packages.
set -euo pipefail
mcpp=$1 dir=$2 work=$3 name=$4 bytes=$5
here=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null || { echo "no node: skipped"; exit 77; }
[ -f "$dir/tokenizer.json" ] && [ -d "$here/../../../third_party/node/node_modules/tokenizers" ] ||
  { echo "no $dir/tokenizer.json or npm tokenizers (scripts/install_deps.sh): skipped"; exit 77; }
mkdir -p "$work"
text=$work/$name.txt
: > "$text"
if [ -d /usr/share/games/fortunes ]; then
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort | xargs cat 2>/dev/null |
    head -c "$bytes" | iconv -f utf-8 -t utf-8 -c >> "$text" || true
fi
cat "$here/texts/multilingual.txt" "$here/texts/varied.txt" >> "$text"
node "$here/hf_reference.js" fuzz 11 30000 "$work/$name.fuzz.txt"
cat "$work/$name.fuzz.txt" >> "$text"
node "$here/hf_reference.js" encode "$dir/tokenizer.json" "$text" > "$work/$name.ref.ids"
"$mcpp" tokenize --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$dir" < "$text" > "$work/$name.mcpp.ids"
if ! cmp -s "$work/$name.ref.ids" "$work/$name.mcpp.ids"; then
  echo "FAIL: ids differ from tokenizers on $text; first differences (index ref mcpp):"
  paste -d' ' <(tr ' ' '\n' < "$work/$name.ref.ids") <(tr ' ' '\n' < "$work/$name.mcpp.ids") |
    awk '$1 != $2 { print NR - 1, $1, $2; if (++n == 10) exit }'
  exit 1
fi
node "$here/hf_reference.js" decode "$dir/tokenizer.json" "$work/$name.ref.ids" > "$work/$name.ref.txt"
"$mcpp" tokenize --decode --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$dir" < "$work/$name.ref.ids" \
  > "$work/$name.mcpp.txt"
cmp -s "$work/$name.ref.txt" "$work/$name.mcpp.txt" || { echo "FAIL: decode differs from tokenizers"; exit 1; }
echo "OK: $(wc -c < "$text") bytes, $(wc -w < "$work/$name.ref.ids") ids equal to tokenizers, decode equal"
