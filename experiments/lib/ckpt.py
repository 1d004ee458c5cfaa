"""Reads mcpp checkpoints and .npy files with the stdlib only (docs/CHECKPOINT_FORMAT.md): the manifest, every
shard's bytes (F32 / BF16) and the logical tensors assembled from their shards (global_offset, local_shape).
Used by E02 (shard checksums, step error) and E11 (checksums and IO bytes across layouts)."""
import array
import ast
import json
import os
import struct


def iter_dir(save, iteration=None):
    if iteration is None:
        iteration = int(open(os.path.join(save, "latest_checkpointed_iteration.txt")).read().strip())
    return os.path.join(save, f"iter_{iteration:07d}")


def manifest(d):
    return json.load(open(os.path.join(d, "manifest.json")))


def shard_values(d, e):
    with open(os.path.join(d, e["file"]), "rb") as f:
        f.seek(e["byte_offset"])
        raw = f.read(e["byte_length"])
    if e["dtype"] == "F32":
        a = array.array("f")
        a.frombytes(raw)
        return a
    if e["dtype"] == "BF16":
        u = array.array("H")
        u.frombytes(raw)
        return array.array("f", struct.unpack(f"<{len(u)}f", b"".join(struct.pack("<I", x << 16) for x in u)))
    raise ValueError(f"{d}: tensor '{e['key']}': dtype {e['dtype']} not read here")


def logical_tensors(d, keep=lambda key: True):
    """{key: (global_shape, flat list of floats)} with every shard placed at its global offset."""
    out = {}
    for e in manifest(d)["tensors"]:
        if not keep(e["key"]):
            continue
        shape = e["global_shape"]
        n = 1
        for x in shape:
            n *= x
        flat = out.setdefault(e["key"], (shape, [None] * n))[1]
        vals, loc, off = shard_values(d, e), e["local_shape"], e["global_offset"]
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        inner = loc[-1] if loc else 1
        rows = len(vals) // inner if inner else 0
        for r in range(rows):  # each row of the local block: its multi-index over the leading dims
            idx, rem = [], r
            for dim in reversed(loc[:-1]):
                idx.append(rem % dim)
                rem //= dim
            idx = list(reversed(idx))
            base = sum((off[i] + idx[i]) * strides[i] for i in range(len(idx))) + (off[-1] if loc else 0)
            flat[base:base + inner] = vals[r * inner:(r + 1) * inner]
    for k, (shape, flat) in out.items():
        if any(v is None for v in flat):
            raise ValueError(f"{d}: tensor '{k}' is not fully covered by its shards")
    return out


def shard_checksums(d):
    """[(key, global_offset, local_shape, file, xxh3)] of every manifest entry."""
    return [(e["key"], e["global_offset"], e["local_shape"], e["file"], e["xxh3"]) for e in manifest(d)["tensors"]]


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def read_npy(path):
    """(shape, flat array('f')) of a little-endian float32 .npy."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ValueError(f"{path}: not a .npy file")
        major = f.read(2)[0]
        hlen = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))[0]
        header = ast.literal_eval(f.read(hlen).decode("latin1"))
        if header["descr"] not in ("<f4", "=f4") or header["fortran_order"]:
            raise ValueError(f"{path}: expected C-order float32, got {header}")
        a = array.array("f")
        a.frombytes(f.read())
    return tuple(header["shape"]), a


def max_abs_diff(a, b):
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)
