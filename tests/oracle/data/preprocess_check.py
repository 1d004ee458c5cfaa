#!/usr/bin/env python3
"""End-to-end check of `mcpp data preprocess` against Megatron's preprocess_data.py logic.

usage: preprocess_check.py MCPP_BIN WORKDIR

For a .jsonl input (strings, lists of sentences, empty documents, non-ASCII, two --json-keys) and a
.txt fortune-format input, the expected documents are assembled here as Megatron's Encoder.encode does
(each non-empty sentence a sequence, EOD appended to the last one), with token ids from
`mcpp tokenize` per sentence; they are written with the independent Megatron-layout writer
(../megatron_indexed_writer.py) and compared byte for byte with what `mcpp data preprocess` wrote.
Also: a missing input and a bad JSON line exit with code 2 and one line on stderr.
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from megatron_indexed_writer import write  # noqa: E402

MCPP, WORK = sys.argv[1], sys.argv[2]
shutil.rmtree(WORK, ignore_errors=True)  # a rerun starts clean (its checkpoint would refuse to be overwritten)
os.makedirs(WORK)
EOD = 50256
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def tokenize(text):
    out = subprocess.run([MCPP, "tokenize"], input=text.encode("utf-8"), capture_output=True, check=True)
    return [int(t) for t in out.stdout.split()]


def megatron_document(value, append_eod):
    sentences = value if isinstance(value, list) else [value]
    ids, lens = [], []
    for s in sentences:
        sid = tokenize(s)
        if sid:
            ids.append(sid)
            lens.append(len(sid))
    if ids and append_eod:
        ids[-1] = ids[-1] + [EOD]
    return ids


def compare(ours, expected_docs, what):
    ref = os.path.join(WORK, "ref_" + os.path.basename(ours))
    write(ref, 8, expected_docs)  # uint16: GPT-2's 50257 ids < 65500 (DType.optimal_dtype)
    for ext in (".idx", ".bin"):
        a = open(ours + ext, "rb").read()
        b = open(ref + ext, "rb").read()
        check(a == b, f"{what}: {ext} differs from the Megatron-layout writer ({len(a)} vs {len(b)} bytes)")


def run(args):
    return subprocess.run([MCPP, "data", "preprocess"] + args, capture_output=True, text=True)


os.makedirs(WORK, exist_ok=True)

# ---- JSONL, two keys, with and without EOD
rows = [
    {"text": "Hello world, this is a test.", "title": "Greeting"},
    {"text": ["First sentence.", "", " Second one, after an empty sentence."], "title": ""},
    {"text": "", "title": "An empty text: Megatron records an empty document."},
    {"text": "caf\u00e9 \U0001F600 \u4e2d\u6587 tabs\tand\nnewlines\n", "title": "x"},
    {"text": "  leading spaces and 1234567 numbers's", "title": ["a", "b"]},
]
src = os.path.join(WORK, "in.jsonl")
with open(src, "w", encoding="utf-8") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
    f.write("\n")  # blank lines are skipped
for eod in (True, False):
    prefix = os.path.join(WORK, "j_eod" if eod else "j_plain")
    r = run(["--input", src, "--output-prefix", prefix, "--json-keys", "text", "title", "--workers", "2"]
            + (["--append-eod"] if eod else []))
    check(r.returncode == 0, f"jsonl preprocess exit {r.returncode}: {r.stderr}")
    check(f"use --data-path {prefix}_text_document" in r.stdout, "stdout names the --data-path prefix")
    for key in ("text", "title"):
        compare(f"{prefix}_{key}_document", [megatron_document(row[key], eod) for row in rows], f"jsonl {key} eod={eod}")

# ---- fortune format: %-separated, whitespace-only documents skipped
fortunes = ["A fortune.\n  -- someone\n", "   \n", "Second\nfortune with a % inside\n", "", "Last one without newline"]
src = os.path.join(WORK, "in.txt")
with open(src, "w", encoding="utf-8") as f:
    f.write("%\n".join(fortunes))
prefix = os.path.join(WORK, "fortunes")
r = run(["--input", src, "--output-prefix", prefix, "--append-eod"])
check(r.returncode == 0, f"txt preprocess exit {r.returncode}: {r.stderr}")
docs = []
for d in fortunes:
    text = d if d.endswith("\n") or not d else d + "\n"  # each line is read back with its newline
    if text.strip():
        docs.append(megatron_document(text, True))
compare(prefix + "_text_document", docs, "txt")

# ---- errors: exit 2, exactly one line
r = run(["--input", os.path.join(WORK, "missing.jsonl"), "--output-prefix", os.path.join(WORK, "m")])
check(r.returncode == 2, f"missing input exits 2 (got {r.returncode})")
check(len(r.stderr.strip().splitlines()) == 1 and "missing.jsonl" in r.stderr, f"one line naming the file: {r.stderr!r}")
bad = os.path.join(WORK, "bad.jsonl")
with open(bad, "w") as f:
    f.write('{"text": "ok"}\n{"text": broken}\n')
r = run(["--input", bad, "--output-prefix", os.path.join(WORK, "b")])
check(r.returncode == 2 and "bad.jsonl:2:" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      f"bad JSON line names line 2: {r.returncode} {r.stderr!r}")
check(not os.path.exists(os.path.join(WORK, "b_text_document.bin")) and
      not os.path.exists(os.path.join(WORK, "b_text_document.bin.tmp")), "a failed run leaves no output")


# ---- --workers: threads tokenize, the output is byte-identical for every N (several 1024-document batches, a
# Hugging Face tokenizer with BOS and EOS); the first bad line in input order is the one named
HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tokenizer", "hf", "llama2")
hf_flags = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", HF]
big = os.path.join(WORK, "big.jsonl")
with open(big, "w", encoding="utf-8") as f:
    for i in range(3500):
        f.write(json.dumps({"text": f"Doc {i}: caf\u00e9 {i * 7919 % 1000} \U0001F600 " + "word " * (i % 13)}) + "\n")
outs = []
for workers in (1, 3):
    prefix = os.path.join(WORK, f"w{workers}")
    r = run(["--input", big, "--output-prefix", prefix, "--append-eod", "--workers", str(workers)] + hf_flags)
    check(r.returncode == 0, f"--workers {workers} exit {r.returncode}: {r.stderr}")
    outs.append([open(prefix + "_text_document" + e, "rb").read() for e in (".bin", ".idx")])
check(outs[0] == outs[1], "--workers 3 output differs from --workers 1")
first = [json.loads(l)["text"] for l in open(big, encoding="utf-8")][:5]
ids = subprocess.run([MCPP, "tokenize", "--append-eod"] + hf_flags, input=first[0].encode(), capture_output=True,
                     check=True).stdout.split()
check(ids[0] == b"1" and ids[-1] == b"2", f"Llama 2 BOS / EOS around the document: {ids[:3]} .. {ids[-2:]}")
hf_docs = []
for t in first:
    sid = [int(x) for x in subprocess.run([MCPP, "tokenize"] + hf_flags, input=t.encode(), capture_output=True,
                                          check=True).stdout.split()]
    hf_docs.append([sid + [2]])
prefix = os.path.join(WORK, "hf_head")
with open(prefix + ".jsonl", "w", encoding="utf-8") as f:
    for t in first:
        f.write(json.dumps({"text": t}) + "\n")
r = run(["--input", prefix + ".jsonl", "--output-prefix", prefix, "--append-eod", "--workers", "2"] + hf_flags)
compare(prefix + "_text_document", hf_docs, "HuggingFaceTokenizer jsonl")
with open(big) as f:
    lines = f.readlines()
lines[2999] = '{"text": broken}\n'
lines[3299] = '{"nokey": 1}\n'
bad2 = os.path.join(WORK, "bad2.jsonl")
open(bad2, "w").writelines(lines)
r = run(["--input", bad2, "--output-prefix", os.path.join(WORK, "b2"), "--workers", "3", "--log-interval", "0"])
check(r.returncode == 2 and "bad2.jsonl:3000:" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
      f"--workers 3: the first bad line (3000) is named: {r.returncode} {r.stderr!r}")
r = run(["--input", src, "--output-prefix", os.path.join(WORK, "w0"), "--workers", "0"])
check(r.returncode == 2 and "--workers 0" in r.stderr, f"--workers 0 is an error: {r.stderr!r}")

# ---- train and generate with the Hugging Face tokenizer: the vocabulary (2000, padded to 2048 by the default
# make_vocab_size_divisible_by 128) and EOD come from it; generate decodes with it; a missing model is one error line
ckpt = os.path.join(WORK, "hf_ckpt")
train = [MCPP, "train", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "2",
         "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0", "--data-path", os.path.join(WORK, "w1_text_document"),
         "--split", "100,0,0", "--save", ckpt] + hf_flags
r = subprocess.run(train, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
check(r.returncode == 0, f"train with HuggingFaceTokenizer: exit {r.returncode} {r.stderr[-500:]}")
cfg = json.load(open(os.path.join(ckpt, "iter_0000002", "manifest.json")))["meta"]["config"]
check(cfg["model"]["vocab_size"] == 2000 and cfg["model"]["padded_vocab_size"] == 2048 and
      cfg["data"]["tokenizer_model"] == HF, f"the checkpoint's vocabulary and tokenizer: {cfg['model']['vocab_size']}")
r = subprocess.run([MCPP, "generate", "--load", ckpt, "--prompt", "Doc 7: caf\u00e9", "--max-new-tokens", "5"] + hf_flags,
                   capture_output=True, text=True)
check(r.returncode == 0 and r.stdout.startswith("Doc 7: caf\u00e9"), f"generate: {r.returncode} {r.stdout!r} {r.stderr[-300:]}")
r = subprocess.run(train[:-2] + ["--tokenizer-type", "HuggingFaceTokenizer"], capture_output=True, text=True)
err = [l for l in r.stderr.splitlines() if l.strip()]
check(r.returncode == 2 and len(err) == 1 and "needs --tokenizer-model" in err[0], f"train without the model: {r.stderr!r}")

print("OK" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
