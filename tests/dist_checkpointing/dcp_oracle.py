"""Independent reader of mcpp sharded checkpoints (struct + json + numpy + python3-xxhash).

assemble(ckdir) -> {key: numpy array}: reads manifest.json, checks for every entry that the data
file's safetensors header holds it (name "<key>" or "<key>@<offsets>", same dtype/shape, absolute
offset = 8 + N + begin), that the XXH3-64 of its bytes equals the manifest's, and places it at its
global offset; then checks that every element of every key was written exactly once.
"""
import json
import os
import struct

import sys

import numpy as np
import xxhash

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle", "ckpt"))
import manifest_checksum  # noqa: E402

DT = {"F32": "<f4", "BF16": "<u2", "F16": "<f2", "I32": "<i4", "I64": "<i8"}


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def entry_name(e):
    whole = all(o == 0 for o in e["global_offset"]) and e["local_shape"] == e["global_shape"]
    return e["key"] if whole else e["key"] + "@" + ",".join(str(o) for o in e["global_offset"])


def assemble(ckdir):
    man = json.load(open(os.path.join(ckdir, "manifest.json")))
    assert man["format"] == "mcpp-checkpoint" and man["format_version"] in (1, 2, 3), "manifest format"
    manifest_checksum.check(man)
    out, count, headers = {}, {}, {}
    for e in man["tensors"]:
        f = e["file"]
        if f not in headers:
            headers[f] = header(os.path.join(ckdir, f))
        n, h = headers[f]
        he = h[entry_name(e)]
        assert he["dtype"] == e["dtype"] and he["shape"] == e["local_shape"], e["key"]
        assert 8 + n + he["data_offsets"][0] == e["byte_offset"], e["key"]
        with open(os.path.join(ckdir, f), "rb") as fh:
            fh.seek(e["byte_offset"])
            raw = fh.read(e["byte_length"])
        assert xxhash.xxh3_64_hexdigest(raw) == e["xxh3"], f"xxh3 of {e['key']}"
        k = e["key"]
        if k not in out:
            out[k] = np.zeros(e["global_shape"], dtype=DT[e["dtype"]])
            count[k] = np.zeros(e["global_shape"], dtype=np.int32)
        sl = tuple(slice(o, o + s) for o, s in zip(e["global_offset"], e["local_shape"]))
        out[k][sl] = np.frombuffer(raw, dtype=DT[e["dtype"]]).reshape(e["local_shape"])
        count[k][sl] += 1
    for k, c in count.items():
        assert (c == 1).all(), f"{k}: elements covered {c.min()}..{c.max()} times"
    return out, man
