#!/usr/bin/env python3
"""Oracle for GPTDataset: Megatron-Core's split / document / sample / shuffle index construction and
sample assembly (megatron/core/datasets/gpt_dataset.py, blended_megatron_dataset_config.py split
matrix + blended_megatron_dataset_builder.py bookends, helpers.cpp build_sample_idx), re-stated with numpy and numpy.random.RandomState.

usage: megatron_gpt_indices.py PREFIX SPLIT SPLIT_INDEX SEQ_LENGTH NUM_SAMPLES SEED
  NUM_SAMPLES 0 means Megatron's num_samples=None (one epoch).
Prints JSON: split_indices, num_epochs, separate_final_epoch, document_index, sample_index (flat),
shuffle_index, samples (token lists of every sample in shuffled order).
"""
import functools
import json
import os
import re
import sys

import numpy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from megatron_indexed_writer import read  # noqa: E402


def split_indices(split_str, num_elements):
    # blended_megatron_dataset_config.py parse_and_normalize_split + convert_split_vector_to_split_matrix,
    # blended_megatron_dataset_builder.py: beg/end = int(round(bookend * float(num_elements))).
    split = list(map(float, re.findall(r"[.0-9]+", split_str)))
    split = split + [0.0] * (3 - len(split))
    w = numpy.array(split, dtype=numpy.float64)
    split = (w / numpy.sum(w)).tolist()
    expansion = functools.reduce(lambda a, b: a + [a[len(a) - 1] + b], [[0], *split])
    return [int(round(b * float(num_elements))) for b in expansion]


def build_document_index(documents, num_epochs, rs, separate_final_epoch):
    if not separate_final_epoch or num_epochs == 1:
        di = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        di[:] = documents
        di = di.reshape(-1).astype(numpy.int32)
        rs.shuffle(di)
        return di
    first = build_document_index(documents, num_epochs - 1, rs, False)
    last = build_document_index(documents, 1, rs, False)
    return numpy.concatenate((first, last))


def build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch):
    num_samples = (num_epochs * tokens_per_epoch - 1) // seq_length
    out = numpy.zeros((num_samples + 1, 2), dtype=numpy.int64)
    k, di, off = 1, 0, 0
    while k <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            doc_len = int(sizes[doc_idx[di]]) - off
            remaining -= doc_len
            if remaining <= 0:
                off += remaining + doc_len - 1
                remaining = 0
            else:
                if di == len(doc_idx) - 1:
                    off = int(sizes[doc_idx[di]]) - 1
                    break
                di += 1
                off = 0
        out[k] = (di, off)
        k += 1
    return out


def build_shuffle_index(num_samples, total_size, rs):
    first = numpy.arange(0, num_samples, dtype=numpy.uint32)
    rs.shuffle(first)
    if num_samples == total_size:
        return first
    last = numpy.arange(num_samples, total_size, dtype=numpy.uint32)
    rs.shuffle(last)
    return numpy.concatenate((first, last))


def main():
    prefix, split, split_index, seq_length, num_samples, seed = sys.argv[1:7]
    split_index, seq_length, num_samples, seed = map(int, (split_index, seq_length, num_samples, seed))
    _, _, seqs = read(prefix)
    sizes = numpy.array([len(s) for s in seqs], dtype=numpy.int32)
    bounds = split_indices(split, len(seqs))
    indices = numpy.arange(bounds[split_index], bounds[split_index + 1], dtype=numpy.int32)
    tokens_per_epoch = int(numpy.sum(sizes[indices]))
    num_epochs, num_tokens = 1, tokens_per_epoch
    if num_samples:
        while num_tokens < num_samples * seq_length + 1:
            num_epochs += 1
            num_tokens += tokens_per_epoch
    separate = False
    if num_epochs > 1:
        sans_final = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        from_final = num_samples - sans_final
        per_epoch = (tokens_per_epoch - 1) // seq_length
        separate = from_final < int(0.80 * per_epoch)
    rs = numpy.random.RandomState(seed)
    doc_idx = build_document_index(indices, num_epochs, rs, separate)
    sample_idx = build_sample_idx(sizes, doc_idx, seq_length, num_epochs, tokens_per_epoch)
    n = sample_idx.shape[0] - 1
    shuffle_idx = build_shuffle_index(sans_final if separate else n, n, rs)
    samples = []
    for i in range(n):
        j = int(shuffle_idx[i])
        (d0, o0), (d1, o1) = sample_idx[j], sample_idx[j + 1]
        if d0 == d1:
            parts = [seqs[doc_idx[d0]][o0:o1 + 1]]
        else:
            parts = [seqs[doc_idx[d]][(o0 if d == d0 else 0):(None if d < d1 else o1 + 1)]
                     for d in range(d0, d1 + 1)]
        samples.append([t for p in parts for t in p])
    json.dump({"split_indices": bounds, "num_epochs": num_epochs, "separate_final_epoch": separate,
               "document_index": doc_idx.tolist(), "sample_index": sample_idx.reshape(-1).tolist(),
               "shuffle_index": shuffle_idx.tolist(), "samples": samples}, sys.stdout)


if __name__ == "__main__":
    main()
