"""Independent check of the manifest checksum (docs/CHECKPOINT_FORMAT.md, "Manifest checksum"), with Python's
json + python3-xxhash instead of nlohmann + libxxhash.

field_checksums(man) -> {path: hex}: every field path of the manifest (objects split down to depth 3, arrays at
depth <= 2 split into elements, tensors named "tensors[<key>@<offsets>]") -> XXH3-64 of the value's compact dump
with sorted keys. check(man) asserts that a version-3 manifest's manifest_field_xxh3 equals it and that
manifest_xxh3 is the XXH3-64 of that map's compact dump. reseal(man) recomputes both (tests that damage a
manifest "consistently", as a buggy writer would).
"""
import json

import xxhash

WHOLE, FIELDS = "manifest_xxh3", "manifest_field_xxh3"


def canon(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def tensor_name(e, i):
    if isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("global_offset"), list):
        return "tensors[%s@%s]" % (e["key"], ",".join(canon(d) for d in e["global_offset"]))
    return "tensors[%d]" % i


def field_checksums(man):
    out = {}

    def add(name, v):
        h = xxhash.xxh3_64_hexdigest(canon(v).encode())
        out[name] = out[name] + "," + h if name in out else h

    def walk(v, path, depth):
        if isinstance(v, dict) and v and depth < 3:
            for k in sorted(v):
                if depth == 0 and k in (WHOLE, FIELDS):
                    continue
                walk(v[k], k if not path else path + "." + k, depth + 1)
        elif isinstance(v, list) and v and 0 < depth < 3:
            for i, x in enumerate(v):
                add(tensor_name(x, i) if path == "tensors" else "%s[%d]" % (path, i), x)
        else:
            add(path, v)

    walk(man, "", 0)
    return out


def check(man):
    if man["format_version"] < 3 and WHOLE not in man:
        return
    fields = field_checksums(man)
    assert man[FIELDS] == fields, "manifest_field_xxh3 differs: %s" % sorted(
        k for k in set(fields) | set(man[FIELDS]) if fields.get(k) != man[FIELDS].get(k))[:5]
    assert man[WHOLE] == xxhash.xxh3_64_hexdigest(canon(man[FIELDS]).encode()), "manifest_xxh3"


def reseal(man):
    man[FIELDS] = field_checksums(man)
    man[WHOLE] = xxhash.xxh3_64_hexdigest(canon(man[FIELDS]).encode())
