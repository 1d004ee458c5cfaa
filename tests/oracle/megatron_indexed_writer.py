#!/usr/bin/env python3
"""Independent oracle for Megatron's indexed dataset layout (megatron/core/datasets/indexed_dataset.py).

Written from Megatron's _IndexWriter / _IndexReader with numpy + struct only; it shares no code with
the C++ reader/writer it checks.

  write  --prefix P --dtype CODE --input DOCS.json
         DOCS.json = [[seq, seq, ...], ...]: documents, each a list of sequences (lists of ints).
         Writes P.bin and P.idx exactly as Megatron's IndexedDatasetBuilder (add_item per sequence,
         end_document per document, finalize).
  dump   --prefix P
         Reads P.idx/P.bin and prints JSON {"dtype_code", "document_indices", "sequences"}.
  rewrite --prefix P --out Q
         Reads P, writes the same contents to Q with this writer, then compares P and Q byte for
         byte; exit 1 (with the first differing offset) when they differ.
"""
import argparse
import json
import struct
import sys

import numpy

HEADER = b"MMIDIDX\x00\x00"
CODES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
         6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}


def write(prefix, code, documents):
    dtype = CODES[code]
    sequence_lengths = []
    document_indices = [0]
    with open(prefix + ".bin", "wb") as bin_file:
        for doc in documents:
            for seq in doc:
                arr = numpy.array(seq, dtype=dtype)
                bin_file.write(arr.tobytes(order="C"))
                sequence_lengths.append(arr.size)
            document_indices.append(len(sequence_lengths))
    itemsize = numpy.dtype(dtype).itemsize
    pointers, curr = [], 0
    for length in sequence_lengths:
        pointers.append(curr)
        curr += length * itemsize
    with open(prefix + ".idx", "wb") as idx:
        idx.write(HEADER)
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", code))
        idx.write(struct.pack("<Q", len(sequence_lengths)))
        idx.write(struct.pack("<Q", len(document_indices)))
        idx.write(numpy.array(sequence_lengths, dtype=numpy.int32).tobytes(order="C"))
        idx.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order="C"))
        idx.write(numpy.array(document_indices, dtype=numpy.int64).tobytes(order="C"))


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        assert f.read(9) == HEADER, "bad magic"
        (version,) = struct.unpack("<Q", f.read(8))
        assert version == 1, version
        (code,) = struct.unpack("<B", f.read(1))
        (seq_count,) = struct.unpack("<Q", f.read(8))
        (doc_count,) = struct.unpack("<Q", f.read(8))
        offset = f.tell()
    buf = numpy.memmap(prefix + ".idx", mode="r", order="C")
    lengths = numpy.frombuffer(buf, dtype=numpy.int32, count=seq_count, offset=offset)
    pointers = numpy.frombuffer(buf, dtype=numpy.int64, count=seq_count, offset=offset + lengths.nbytes)
    doc_idx = numpy.frombuffer(buf, dtype=numpy.int64, count=doc_count,
                               offset=offset + lengths.nbytes + pointers.nbytes)
    bin_buf = numpy.fromfile(prefix + ".bin", dtype=numpy.uint8)
    dtype = CODES[code]
    sequences = [numpy.frombuffer(bin_buf, dtype=dtype, count=int(n), offset=int(p)).tolist()
                 for n, p in zip(lengths, pointers)]
    return code, doc_idx.tolist(), sequences


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["write", "dump", "rewrite"])
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--dtype", type=int)
    ap.add_argument("--input")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.cmd == "write":
        with open(a.input) as f:
            write(a.prefix, a.dtype, json.load(f))
    elif a.cmd == "dump":
        code, doc_idx, seqs = read(a.prefix)
        json.dump({"dtype_code": code, "document_indices": doc_idx, "sequences": seqs}, sys.stdout)
    else:
        code, doc_idx, seqs = read(a.prefix)
        docs = [seqs[doc_idx[d]:doc_idx[d + 1]] for d in range(len(doc_idx) - 1)]
        write(a.out, code, docs)
        for ext in (".idx", ".bin"):
            x = open(a.prefix + ext, "rb").read()
            y = open(a.out + ext, "rb").read()
            if x != y:
                at = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
                print(f"{ext} differs: {len(x)} vs {len(y)} bytes, first difference at byte {at}")
                return 1
        print(f"identical: {len(seqs)} sequences, {len(doc_idx) - 1} documents, dtype code {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
