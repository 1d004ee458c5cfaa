#!/usr/bin/env bash
# Makes the committed SentencePieceTokenizer fixtures (tests/oracle/tokenizer/spm/): two small models trained with
# Debian's spm_train on the committed texts (BPE with byte fallback as Llama 2's, and unigram), and expected.json
# with, per text, the ids of python3-sentencepiece's encode_as_ids and its decode_ids of them.
#   bash tests/oracle/tokenizer/make_spm_fixtures.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/spm
mkdir -p "$out"
train=$(mktemp)
trap 'rm -f "$train"' EXIT
cat "$here"/texts/varied.txt "$here"/texts/multilingual.txt > "$train"  # fuzz_hf.txt stays unseen: byte fallback / unk
spm_train --input="$train" --model_prefix="$out/bpe" --model_type=bpe --vocab_size=1000 --byte_fallback=true \
  --character_coverage=0.98 --split_digits=true --allow_whitespace_only_pieces=true --remove_extra_whitespaces=false \
  --normalization_rule_name=identity --minloglevel=2 --input_sentence_size=0 --max_sentence_length=100000 >/dev/null
spm_train --input="$train" --model_prefix="$out/unigram" --model_type=unigram --vocab_size=500 \
  --character_coverage=1.0 --minloglevel=2 --max_sentence_length=100000 >/dev/null
rm -f "$out"/*.vocab
/usr/bin/python3 - "$here" <<'PY'
import json, os, sys
import sentencepiece as spm
here = sys.argv[1]
texts = ["varied.txt", "multilingual.txt", "fuzz_hf.txt"]
for name in ("bpe", "unigram"):
    sp = spm.SentencePieceProcessor(model_file=os.path.join(here, "spm", name + ".model"))
    exp = {}
    for t in texts:
        text = open(os.path.join(here, "texts", t), encoding="utf-8", newline="").read()
        ids = sp.encode_as_ids(text)
        exp[t] = {"ids": ids, "decoded": sp.decode_ids(ids)}
    exp["meta"] = {"vocab_size": sp.get_piece_size(), "eos_id": sp.eos_id(), "bos_id": sp.bos_id()}
    json.dump(exp, open(os.path.join(here, "spm", name + ".expected.json"), "w"))
    print(name, sp.get_piece_size(), [len(exp[t]["ids"]) for t in texts])
PY
