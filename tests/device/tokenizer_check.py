#!/usr/bin/env python3
"""HuggingFaceTokenizer / SentencePieceTokenizer against Python `tokenizers` and `sentencepiece` on a >= 10 MB text,
and `mcpp data preprocess --workers N` throughput against the same tokenizers driven as Megatron's
tools/preprocess_data.py drives them (a multiprocessing Pool of JSON-decode + tokenize per line). CPU only.

usage (repo root, on the device machine: Python with tokenizers + sentencepiece, no internet):
  . bench/gpu/env.sh && python3 tests/device/tokenizer_check.py $MCPP OUT [--mb 12] [--workers 1,2,4,8,16]
  (without the carry: python3 tests/device/tokenizer_check.py build/bin/mcpp OUT)

1. The text (OUT/corpus.txt, >= --mb MB): Python's stdlib sources, generated multilingual text (18 scripts,
   combining marks, CJK, emoji sequences, every whitespace kind incl. U+000B / U+0085 / U+3000 / U+FEFF, digit runs,
   contractions in both cases) and special tokens inline; OUT/corpus.jsonl: the same as ~1 KB documents.
2. Trains small tokenizers (vocab 8000) of each family on it with the Python trainers and writes each as a
   tokenizer directory: llama3 (Llama 3 regex, ignore_merges, BOS template), qwen2 (NFC, one digit a piece),
   gpt-neox (ByteLevel regex), mistral-nemo (Tekken regex: the general ICU path), llama2 (Prepend + Replace
   normalizers, byte fallback <0xXX> tokens, BOS template), mistral-7b (Metaspace prepend "first"); and with
   sentencepiece: spm-bpe (byte fallback) and spm-unigram.
3. For each: `mcpp tokenize` of the whole text equals Python's encode(text).ids (HF: add_special_tokens=True;
   sentencepiece: encode_as_ids) — zero mismatches expected — and `mcpp tokenize --decode` of those ids equals
   Python's decode.
4. For llama3, qwen2, llama2, spm-bpe and spm-unigram: `mcpp data preprocess --append-eod --workers N` over corpus.jsonl
   (MB/s printed by mcpp, the .bin equal to Python's per-document ids + EOD) vs the Python Pool path at the same
   worker counts (MB/s of input JSON).
Prints one line per check and a table; the last line is "tokenizer_check: PASS" or "... FAIL (n)"; exit 0 / 1.
"""
import argparse
import glob
import json
import multiprocessing
import os
import random
import subprocess
import sys
import sysconfig
import time

import numpy as np

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
          r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>"]
failures = []


def log(msg):
    print(msg, flush=True)


def check(cond, what):
    log(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def build_corpus(out, mb):
    parts, size = [], 0  # running sizes: summing the lists each step was quadratic (minutes at 12 MB)
    for f in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True)):
        try:
            parts.append(open(f, encoding="utf-8").read())
        except (UnicodeDecodeError, OSError):
            continue
        size += len(parts[-1])
        if size > mb * 1_000_000 * 0.6:
            break
    rnd = random.Random(1)
    ranges = [(0x61, 0x7a), (0x41, 0x5a), (0xc0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x5ff),
              (0x600, 0x6ff), (0x900, 0x97f), (0x980, 0x9ff), (0xe00, 0xe5b), (0x10a0, 0x10ff), (0x1100, 0x11ff),
              (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3), (0xff01, 0xff5e), (0x1f300, 0x1f64f),
              (0x1f900, 0x1f9ff)]
    spaces = [" "] * 12 + ["  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "\u000b", "\u0085", "\u2028",
                           "\ufeff", "\u200b", "   "]
    extras = ["'s", "'S", "'ll", "'VE", "'re", "'d", "'M", "'t", "e\u0301", "a\u0308", "\uff11\uff12",
              "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F1E9\U0001F1EA", "12345678", "3.14", "..."]
    words = []
    for _ in range(5000):
        a, b = rnd.choice(ranges)
        words.append("".join(chr(rnd.randint(a, b)) for _ in range(rnd.randint(1, 9))))
    gen, size = [], 0
    while size < mb * 1_000_000 * 0.35:
        x = rnd.random()
        gen.append(rnd.choice(SPECIALS) if x < 0.002 else rnd.choice(extras) if x < 0.05 else rnd.choice(words))
        gen.append(rnd.choice(spaces))
        size += len(gen[-2]) + len(gen[-1])
    parts.append("".join(gen))
    text = "\n".join(parts)
    while len(text.encode()) < mb * 1_000_000:
        text += text[: mb * 1_000_000 - len(text.encode()) + 1000]
    with open(os.path.join(out, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for i in range(0, len(text), 1000):
            f.write(json.dumps({"text": text[i:i + 1000]}) + "\n")
    return text


def save_hf(tok, out, name, eos, bos):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    json.dump({"eos_token": eos, "bos_token": bos}, open(os.path.join(d, "tokenizer_config.json"), "w"))
    return d


def train_hf(out, corpus_file):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    dirs = {}

    def byte_level(name, pattern, normalizer, specials, bos, eos, ignore_merges=False, regex_split=True):
        tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
        if normalizer:
            tok.normalizer = normalizer
        if regex_split:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        tok.train([corpus_file], trainers.BpeTrainer(vocab_size=8000, special_tokens=specials, show_progress=False,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        if bos:
            tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
        dirs[name] = save_hf(tok, out, name, eos, bos)

    byte_level("llama3", LLAMA3, None, ["<|begin_of_text|>", "<|end_of_text|>"], "<|begin_of_text|>",
               "<|end_of_text|>", ignore_merges=True)
    byte_level("qwen2", QWEN2, normalizers.NFC(), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None,
               "<|endoftext|>")
    byte_level("gpt-neox", None, normalizers.NFC(), ["<|endoftext|>"], None, "<|endoftext|>", regex_split=False)
    byte_level("mistral-nemo", TEKKEN, None, ["<unk>", "<s>", "</s>"], "<s>", "</s>")

    # Llama 2 style: byte fallback over <0x00>..<0xFF> model tokens (ids 3..258), as its tokenizer.json
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.train([corpus_file], trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>", "<s>", "</s>"],
                                                 show_progress=False, limit_alphabet=300))
    j = json.loads(tok.to_str())
    old = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    for t, _ in old:
        vocab.setdefault(t, len(vocab))
    j["model"]["vocab"] = vocab
    for a in j["added_tokens"]:
        a["id"] = vocab[a["content"]]
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                                     {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    llama2 = Tokenizer.from_str(json.dumps(j))
    dirs["llama2"] = save_hf(llama2, out, "llama2", "</s>", "<s>")
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    j["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Metaspace", "replacement":
                    "\u2581", "prepend_scheme": "first", "split": False}, {"type": "Fuse"}]}
    dirs["mistral-7b"] = save_hf(Tokenizer.from_str(json.dumps(j)), out, "mistral-7b", "</s>", "<s>")
    return dirs


def train_spm(out, corpus_file):
    import sentencepiece as spm

    models = {}
    for name, kind, extra in (("spm-bpe", "bpe", {"byte_fallback": True}), ("spm-unigram", "unigram", {})):
        prefix = os.path.join(out, name)
        spm.SentencePieceTrainer.train(input=corpus_file, model_prefix=prefix, model_type=kind, vocab_size=8000,
                                       character_coverage=0.9995, input_sentence_size=200000,
                                       shuffle_input_sentence=True, max_sentence_length=100000, minloglevel=2, **extra)
        models[name] = prefix + ".model"
    return models


class Py:
    """One tokenizer, driven as Megatron's HuggingFaceTokenizer / SentencePieceTokenizer drive it."""

    def __init__(self, kind, path):
        self.kind, self.path = kind, path
        if kind == "hf":
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
            self.eod = self.tok.token_to_id(json.load(open(os.path.join(path, "tokenizer_config.json")))["eos_token"])
        else:
            import sentencepiece as spm
            self.tok = spm.SentencePieceProcessor(model_file=path)
            self.eod = self.tok.eos_id()

    def encode(self, text):
        return self.tok.encode(text).ids if self.kind == "hf" else self.tok.encode_as_ids(text)

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False) if self.kind == "hf" else self.tok.decode_ids(ids)

    def flags(self):
        return ["--tokenizer-type", "HuggingFaceTokenizer" if self.kind == "hf" else "SentencePieceTokenizer",
                "--tokenizer-model", self.path]


_worker = None


def _init(kind, path):
    global _worker
    _worker = Py(kind, path)


def _encode_line(line):  # Megatron's Encoder.encode: json.loads, tokenize, EOD appended
    ids = _worker.encode(json.loads(line)["text"])
    return ids + [_worker.eod] if ids else ids, len(line)


def python_preprocess(py, jsonl, workers):
    t0 = time.time()
    total, docs = 0, []
    with open(jsonl, encoding="utf-8") as f, multiprocessing.Pool(workers, _init, (py.kind, py.path)) as pool:
        for ids, n in pool.imap(_encode_line, f, 32):
            total += n
            docs.append(ids)
    return total / (time.time() - t0) / 2**20, docs


def unigram_ties(py, want, got):
    """A unigram model's Viterbi may meet segmentations of equal score (e.g. two whitespace pieces in either
    order); which one it keeps is the library version's tie-break (mcpp links Debian's libsentencepiece, the
    oracle is a newer Python sentencepiece). Splits both id streams at the boundaries they share (cumulative
    piece lengths) and counts the differing regions: a tie covers the same normalized text with the same total
    log-probability (|difference| <= 1e-4, float sums); anything else is a real mismatch. Returns (ties, real,
    higher): higher counts the real regions over the same text by which side's pieces score more in float64
    ({"mcpp": k, "python": k}) — a library whose choice scores lower there did not find the optimum (float32 path
    sums over a very long string lose the piece scores' resolution)."""
    n = py.tok.get_piece_size()
    plen = np.array([len(py.tok.id_to_piece(i)) for i in range(n)], dtype=np.int64)
    score = np.array([py.tok.get_score(i) for i in range(n)], dtype=np.float64)
    ca, cb = np.cumsum(plen[want]), np.cumsum(plen[got])
    common = np.intersect1d(ca, cb)
    ia, ib = np.searchsorted(ca, common) + 1, np.searchsorted(cb, common) + 1  # exclusive ends
    sa, sb = np.concatenate([[0], ia[:-1]]), np.concatenate([[0], ib[:-1]])
    one = (ia - sa == 1) & (ib - sb == 1)
    same = one & (want[np.minimum(sa, len(want) - 1)] == got[np.minimum(sb, len(got) - 1)])
    ties = real = 0
    higher = {"mcpp": 0, "python": 0}
    for k in np.nonzero(~same)[0]:
        a, b = want[sa[k]:ia[k]], got[sb[k]:ib[k]]
        text_a = "".join(py.tok.id_to_piece(int(i)) for i in a)
        text_b = "".join(py.tok.id_to_piece(int(i)) for i in b)
        if text_a == text_b and abs(score[a].sum() - score[b].sum()) <= 1e-4:
            ties += 1
        else:
            real += 1
            if text_a == text_b:
                higher["python" if score[a].sum() > score[b].sum() else "mcpp"] += 1
    if ca[-1] != cb[-1]:
        real += 1  # the tails differ in length
    return ties, real, higher


def compare_ids(name, mcpp, py, text, out):
    t0 = time.time()
    want = np.array(py.encode(text), dtype=np.int64)
    t_py = time.time() - t0
    t0 = time.time()
    p = subprocess.run([mcpp, "tokenize", *py.flags()], input=text.encode(), capture_output=True)
    t_mcpp = time.time() - t0
    if p.returncode:
        check(False, f"{name}: mcpp tokenize exit {p.returncode}: {p.stderr.decode()[-300:]}")
        return
    got = np.array(p.stdout.split(), dtype=np.int64)
    n = min(len(got), len(want))
    bad = np.nonzero(got[:n] != want[:n])[0]
    first = int(bad[0]) if len(bad) else (n if len(got) != len(want) else -1)
    detail = ""
    if first >= 0:
        detail = f"; first at {first}: python {want[first:first + 6].tolist()} mcpp {got[first:first + 6].tolist()}"
        if py.kind == "spm" and first < n:  # the pieces and the library versions (mcpp links Debian's libsentencepiece)
            import sentencepiece
            pieces = lambda ids: [py.tok.id_to_piece(int(i)) for i in ids]
            detail += (f"; pieces python {pieces(want[first:first + 6])} mcpp {pieces(got[first:first + 6])}; "
                       f"text {py.decode(want[max(0, first - 4):first + 6].tolist())!r}; "
                       f"python sentencepiece {sentencepiece.__version__}")
            # the same text alone (a Megatron document is ~1 KB, not 17 MB): a unigram Viterbi over one huge string
            # accumulates its path score in float32 (|score| ~ 5e7 here, ulp 4), so whole-text ids depend on each
            # library's arithmetic; equal ids on the window alone mean the two libraries agree on the model
            lo = max(0, first - 8)
            window = py.decode(want[lo:first + 40].tolist())
            q = subprocess.run([mcpp, "tokenize", *py.flags()], input=window.encode(), capture_output=True)
            ids_py, ids_mcpp = py.encode(window), [int(x) for x in q.stdout.split()]
            involved = sorted({int(i) for i in [*want[first:first + 6], *got[first:first + 6]]})
            kinds = [(i, round(py.tok.get_score(i), 4), py.tok.is_unused(i), py.tok.is_byte(i)) for i in involved]
            detail += (f"; the window alone: {'equal' if ids_py == ids_mcpp else 'DIFFERENT'} (python "
                       f"{pieces(ids_py[:12])} mcpp {pieces(ids_mcpp[:12])}); (id, score, unused, byte): {kinds}")
    if first >= 0 and py.kind == "spm" and py.tok.get_piece_size() and "unigram" in name:
        ties, real, higher = unigram_ties(py, want, got)
        detail += (f"; {ties} regions are equal-score ties (same text, both optimal), {real} are not (the higher "
                   f"float64 score: mcpp's in {higher['mcpp']}, python's in {higher['python']})")
        first = -1 if real == 0 else first
    check(first < 0, f"{name}: {len(want)} ids, {len(bad) + abs(len(got) - len(want))} mismatches "
                     f"(python {t_py:.1f} s, mcpp {t_mcpp:.1f} s){detail}")
    ids_file = os.path.join(out, name + ".ids")
    np.savetxt(ids_file, want[None, :], fmt="%d")
    p = subprocess.run([mcpp, "tokenize", "--decode", *py.flags()], stdin=open(ids_file), capture_output=True)
    check(p.returncode == 0 and p.stdout.decode("utf-8", "surrogateescape") == py.decode(want.tolist()),
          f"{name}: mcpp's decode of the ids equals Python's")


def preprocess_speed(name, mcpp, py, out, workers_list):
    rows = []
    for w in workers_list:
        prefix = os.path.join(out, f"pre_{name}_{w}")
        p = subprocess.run([mcpp, "data", "preprocess", "--input", os.path.join(out, "corpus.jsonl"), "--output-prefix",
                            prefix, "--append-eod", "--workers", str(w), "--log-interval", "0", *py.flags()],
                           capture_output=True, text=True)
        if p.returncode:
            check(False, f"{name}: mcpp data preprocess --workers {w}: {p.stderr[-300:]}")
            continue
        ours = float(p.stdout.split("MB/s")[0].rsplit("(", 1)[1])
        theirs, docs = python_preprocess(py, os.path.join(out, "corpus.jsonl"), w)
        idx = open(prefix + "_text_document.idx", "rb").read()
        dtype = {4: np.int32, 8: np.uint16}[idx[17]]  # Megatron's dtype code (9-byte magic, version, code)
        binary = np.fromfile(prefix + "_text_document.bin", dtype=dtype).astype(np.int64)
        want = np.array([t for d in docs for t in d], dtype=np.int64)
        equal, detail = np.array_equal(binary, want), ""
        if not equal and len(binary) == len(want):  # which documents differ, and (unigram) whether each is a tie
            bad_docs, ties, real, off, first = 0, 0, 0, 0, None
            for k, d in enumerate(docs):
                a, b = np.array(d, dtype=np.int64), binary[off:off + len(d)]
                off += len(d)
                if np.array_equal(a, b):
                    continue
                bad_docs += 1
                first = k if first is None else first
                if py.kind == "spm" and "unigram" in name:
                    t, r, _ = unigram_ties(py, a, b)
                    ties, real = ties + t, real + r
            detail = f"; {bad_docs} of {len(docs)} documents differ, the first #{first}"
            if py.kind == "spm" and "unigram" in name:
                detail += f"; {ties} regions are equal-score ties (same text, both optimal), {real} are not"
                equal = real == 0
        elif not equal:
            detail = f"; {len(binary)} ids vs {len(want)}"
        check(equal, f"{name}: preprocess --workers {w}: .bin equals Python's ids + EOD{detail}")
        rows.append((name, w, ours, theirs))
    return rows


def unigram_length_sweep(name, mcpp, py, text):
    """How long one string may be before the two libraries' unigram segmentations differ beyond ties: prefixes of the
    corpus (cut at a newline) from 16 KB to the whole, each encoded as one string by both; per length the regions that
    are not equal-score ties and which side scores higher there (information, not a check)."""
    n = 16 * 1024
    while True:
        cut = text.rfind("\n", 0, n) if n < len(text) else len(text)
        part = text[:cut if cut > 0 else n]
        want = np.array(py.encode(part), dtype=np.int64)
        q = subprocess.run([mcpp, "tokenize", *py.flags()], input=part.encode(), capture_output=True)
        got = np.array(q.stdout.split(), dtype=np.int64)
        if q.returncode == 0 and np.array_equal(want, got):
            log(f"info {name}: one string of {len(part.encode())} bytes: equal ids")
        elif q.returncode == 0:
            ties, real, higher = unigram_ties(py, want, got)
            log(f"info {name}: one string of {len(part.encode())} bytes: {ties} tie regions, {real} not (higher "
                f"float64 score: mcpp's {higher['mcpp']}, python's {higher['python']})")
        if n >= len(text):
            return
        n *= 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mcpp")
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=12)
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--families", default="all", help="comma list (a local smoke test: spm-bpe,spm-unigram)")
    a = ap.parse_args()
    only = None if a.families == "all" else set(a.families.split(","))
    os.makedirs(a.out, exist_ok=True)
    log(f"building a {a.mb} MB corpus ...")
    text = build_corpus(a.out, a.mb)
    corpus_file = os.path.join(a.out, "corpus.txt")
    log(f"corpus: {len(text.encode()) / 1e6:.1f} MB, {len(text)} code points")
    hf = train_hf(a.out, corpus_file) if only is None or only - {"spm-bpe", "spm-unigram"} else {}
    spm_models = train_spm(a.out, corpus_file)
    tokenizers = {**{k: Py("hf", v) for k, v in hf.items()}, **{k: Py("spm", v) for k, v in spm_models.items()}}
    tokenizers = {k: v for k, v in tokenizers.items() if only is None or k in only}
    for name, py in tokenizers.items():
        compare_ids(name, a.mcpp, py, text, a.out)
        if name == "spm-unigram":
            unigram_length_sweep(name, a.mcpp, py, text)
    rows = []
    workers = [int(w) for w in a.workers.split(",")]
    for name in [n for n in ("llama3", "qwen2", "llama2", "spm-bpe", "spm-unigram") if n in tokenizers]:
        rows += preprocess_speed(name, a.mcpp, tokenizers[name], a.out, workers)
    log("\npreprocess throughput (MB/s of input JSONL; Python: Megatron's Pool path with the same tokenizer)")
    log(f"{'tokenizer':<12} {'workers':>7} {'mcpp':>8} {'python':>8} {'ratio':>6}")
    for name, w, ours, theirs in rows:
        log(f"{name:<12} {w:>7} {ours:>8.2f} {theirs:>8.2f} {ours / theirs:>6.2f}")
    log(f"tokenizer_check: {'PASS' if not failures else f'FAIL ({len(failures)})'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
