#!/usr/bin/env python3
"""Random-token corpus in Megatron's indexed-dataset format (PREFIX.bin / PREFIX.idx, uint16 tokens),
for throughput benchmarks that, like ../shared/anchors/torch_gpt.py, train on random tokens.

usage: random_tokens.py PREFIX --tokens N --vocab V [--doc-len L] [--seed S]
Each document is one sequence of L tokens drawn uniformly from [0, V - 1) (V - 1 is the EOD id of
mcpp's NullTokenizer and is never drawn). Layout as Megatron's _IndexWriter (version 1, dtype code 8).
"""
import argparse
import struct

import numpy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--doc-len", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.vocab > 65536:
        raise SystemExit("vocab must fit uint16")
    n_docs = max(1, a.tokens // a.doc_len)
    rng = numpy.random.default_rng(a.seed)
    toks = rng.integers(0, a.vocab - 1, size=n_docs * a.doc_len, dtype=numpy.uint16)
    toks.tofile(a.prefix + ".bin")
    lengths = numpy.full(n_docs, a.doc_len, dtype=numpy.int32)
    pointers = numpy.arange(n_docs, dtype=numpy.int64) * a.doc_len * 2
    doc_idx = numpy.arange(n_docs + 1, dtype=numpy.int64)
    with open(a.prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))
        f.write(struct.pack("<Q", n_docs))
        f.write(struct.pack("<Q", n_docs + 1))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())
    print(f"wrote {a.prefix}.bin/.idx: {n_docs} documents x {a.doc_len} tokens")


if __name__ == "__main__":
    main()
