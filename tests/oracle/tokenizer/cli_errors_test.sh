#!/usr/bin/env bash
# `mcpp tokenize` user errors: each must print one "error: ..." line naming the culprit and exit 2;
# the happy paths of --append-eod and --decode; a 3 MB single word in linear-logarithmic time.
set -uo pipefail
mcpp=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
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
expect_error "tokenizer type" "'BertWordPieceCase' is not supported" "$work/hello.txt" -- --tokenizer-type BertWordPieceCase
expect_error "no tokenizer model (hf)" "needs --tokenizer-model" "$work/hello.txt" -- --tokenizer-type HuggingFaceTokenizer
expect_error "no tokenizer model (spm)" "needs --tokenizer-model" "$work/hello.txt" -- --tokenizer-type SentencePieceTokenizer
mkdir -p "$work/hf_truncated" "$work/hf_unigram"
head -c 300 "$here/hf/llama3/tokenizer.json" > "$work/hf_truncated/tokenizer.json"
printf '{"model": {"type": "Unigram", "vocab": []}}' > "$work/hf_unigram/tokenizer.json"
expect_error "truncated tokenizer.json" "hf_truncated/tokenizer.json is not valid JSON" "$work/hello.txt" -- \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$work/hf_truncated"
expect_error "unigram tokenizer.json" "model type 'Unigram' is not supported" "$work/hello.txt" -- \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$work/hf_unigram"
expect_error "no tokenizer.json" "tokenizer.json not found" "$work/hello.txt" -- \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$work"
head -c 2000 "$here/spm/bpe.model" > "$work/truncated.model"
expect_error "truncated .model" "truncated.model' cannot be loaded" "$work/hello.txt" -- \
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$work/truncated.model"
expect_error "missing .model" "no such file" "$work/hello.txt" -- \
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$work/nope.model"
printf 'ok \303\050 bad' > "$work/badutf8.txt"
expect_error "invalid UTF-8 (hf)" "not valid UTF-8" "$work/badutf8.txt" -- \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$here/hf/qwen3"
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
got=$(printf 'Hello world' | "$mcpp" tokenize --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$here/hf/llama2" --append-eod)
[ "${got%% *}" = "1" ] && [ "${got##* }" = "2" ] || { echo "FAIL: Llama 2 BOS ... EOS gave '$got'"; fails=$((fails + 1)); }
# One 4 MB word (a run of letters is one pre-tokenized piece): BPE in O(n log n), ~2 s; encoder.py's loop, which
# rescans the word every round, needs hours (the ctest timeout). Decoded, the ids give the word back.
awk 'BEGIN { srand(1); for (i = 0; i < 3000000; i++) printf "%c", 97 + int(rand() * 26) }' > "$work/word.txt"
if ! "$mcpp" tokenize < "$work/word.txt" > "$work/word.ids" || ! "$mcpp" tokenize --decode < "$work/word.ids" |
   cmp -s - "$work/word.txt"; then
  echo "FAIL: a 3 MB single word did not round-trip"; fails=$((fails + 1))
fi
"$mcpp" tokenize --help | grep -q -- "--merge-file" || { echo "FAIL: --help lacks --merge-file"; fails=$((fails + 1)); }
[ $fails -eq 0 ] && echo "all ok"
exit $((fails > 0))
