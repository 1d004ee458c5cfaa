#!/usr/bin/env bash
# Tokenizer oracle: `mcpp tokenize` must give the npm gpt-3-encoder's ids exactly, and
# `mcpp tokenize --decode` must give the input back byte for byte.
#   oracle_test.sh MCPP ENCODER_DIR WORKDIR file TEXT      compare on a committed text
#   oracle_test.sh MCPP ENCODER_DIR WORKDIR fuzz SEED N    compare on N seeded random code points
#   oracle_test.sh MCPP ENCODER_DIR WORKDIR fortunes N     compare on the first ~N bytes of the fortunes
#                                                          corpus (exit 77 = skipped when absent)
#   oracle_test.sh MCPP ENCODER_DIR WORKDIR roundtrip-fortunes   whole corpus: decode(encode) only
#                                                          (the JS encoder is quadratic in the token count)
set -euo pipefail
mcpp=$1 enc=$2 work=$3 mode=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
ref() { node "$here/encode_reference.js" "$enc" "$@"; }
mkdir -p "$work"
fortune_files() {
  local d=/usr/share/games/fortunes
  [ -d "$d" ] || { echo "no $d: skipped"; exit 77; }
  find "$d" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort
}
case $mode in
  file) text=$1 ;;
  fuzz) text=$work/fuzz_$1.txt; ref fuzz "$1" "$2" "$text" ;;
  fortunes) text=$work/fortunes_head.txt; mapfile -t files < <(fortune_files); ref head "${files[@]}" "$1" "$text" ;;
  roundtrip-fortunes) text=$work/fortunes_all.txt; mapfile -t files < <(fortune_files); cat "${files[@]}" > "$text" ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
name=$(basename "$text" .txt)
bytes=$(wc -c < "$text")
[ "$bytes" -gt 0 ] || { echo "FAIL: $text is empty"; exit 1; }

"$mcpp" tokenize < "$text" > "$work/$name.mcpp.ids"
"$mcpp" tokenize --decode < "$work/$name.mcpp.ids" > "$work/$name.decoded"
if ! cmp -s "$text" "$work/$name.decoded"; then
  echo "FAIL: decode(encode($text)) differs from the input"; cmp "$text" "$work/$name.decoded" || true; exit 1
fi
ntok=$(wc -w < "$work/$name.mcpp.ids")
if [ "$mode" != roundtrip-fortunes ]; then
  ref encode "$text" > "$work/$name.ref.ids"
  if ! cmp -s "$work/$name.ref.ids" "$work/$name.mcpp.ids"; then
    echo "FAIL: ids differ from gpt-3-encoder on $text; first differences (index ref mcpp):"
    paste -d' ' <(tr ' ' '\n' < "$work/$name.ref.ids") <(tr ' ' '\n' < "$work/$name.mcpp.ids") |
      awk '$1 != $2 { print NR - 1, $1, $2; if (++n == 10) exit }'
    exit 1
  fi
  echo "OK: $bytes bytes, $ntok tokens, ids equal to gpt-3-encoder, decode round-trips"
else
  echo "OK: $bytes bytes, $ntok tokens, decode round-trips"
fi
