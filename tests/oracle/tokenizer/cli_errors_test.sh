#!/usr/bin/env bash
# `mcpp tokenize` user errors: each must print one "error: ..." line naming the culprit and exit 2;
# and the happy paths of --append-eod and --decode.
set -uo pipefail
mcpp=$1 work=$2
mkdir -p "$work"
fails=0
expect_error() {  # expect_error "what" "grep pattern" [stdin-file] -- args...
  local what=$1 pat=$2 input=$3
  shift 4
  local err rc
  err=$("$mcpp" tokenize "$@" < "$input" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "$pat" <<< "$err"; then
    echo "FAIL ($what): rc=$rc stderr='$err' (want rc 2 and /$pat/)"; fails=$((fails + 1))
  else
    echo "ok ($what): $err"
  fi
}
printf 'Hello world' > "$work/hello.txt"
printf '{"a": 0, "b": ' > "$work/truncated.json"
printf 'not json at all' > "$work/notjson.json"
printf '15496 foo 995' > "$work/badids.txt"
printf '15496 50257' > "$work/outofrange.txt"
expect_error "tokenizer type" "not supported" "$work/hello.txt" -- --tokenizer-type SentencePieceTokenizer
expect_error "missing vocab" "$work/nope.json" "$work/hello.txt" -- --vocab-file "$work/nope.json" --merge-file "$work/nope.bpe"
expect_error "truncated vocab" "truncated.json" "$work/hello.txt" -- --vocab-file "$work/truncated.json" --merge-file "$work/nope.bpe"
expect_error "not json" "notjson.json" "$work/hello.txt" -- --vocab-file "$work/notjson.json" --merge-file "$work/nope.bpe"
expect_error "lone vocab flag" "go together" "$work/hello.txt" -- --vocab-file "$work/truncated.json"
expect_error "bad id" "'foo' is not a token id" "$work/badids.txt" -- --decode
expect_error "id out of range" "50257" "$work/outofrange.txt" -- --decode
expect_error "unknown flag" "error" "$work/hello.txt" -- --no-such-flag

got=$("$mcpp" tokenize --append-eod < "$work/hello.txt")
[ "$got" = "15496 995 50256" ] || { echo "FAIL: --append-eod gave '$got', want '15496 995 50256'"; fails=$((fails + 1)); }
got=$(printf '15496 995\n50256\n' | "$mcpp" tokenize --decode)
[ "$got" = "Hello world<|endoftext|>" ] || { echo "FAIL: --decode gave '$got'"; fails=$((fails + 1)); }
got=$(printf '' | "$mcpp" tokenize)
[ -z "$got" ] || { echo "FAIL: empty input gave '$got'"; fails=$((fails + 1)); }
"$mcpp" tokenize --help | grep -q -- "--merge-file" || { echo "FAIL: --help lacks --merge-file"; fails=$((fails + 1)); }
[ $fails -eq 0 ] && echo "all ok"
exit $((fails > 0))
