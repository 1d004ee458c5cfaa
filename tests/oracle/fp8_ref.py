#!/usr/bin/python3
"""FP8 rounding oracle by the formats' definition (OCP FP8: e4m3fn and e5m2), in float64, independent of the C++
emulation (kernels/cpu/fp8.cpp, which computes a quantum from frexp). Decodes all 256 codes of each format, then
rounds each input to the nearest finite value, ties to the even code (mantissa LSB 0), saturating past the largest
finite value (CUDA's __NV_SATFINITE), keeping the sign (-0 stays -0) and NaN. torch 1.13 here has no float8 dtypes.

Writes tests/fixtures/fp8/rounding.tsv: one line per input, three float32 bit patterns in hex: in, e4m3, e5m2.
Usage: /usr/bin/python3 tests/oracle/fp8_ref.py [out.tsv]
"""
import math
import struct
import sys

import numpy as np


def decode(code, ebits, mbits, fn):
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> mbits) & ((1 << ebits) - 1)
    m = code & ((1 << mbits) - 1)
    bias = (1 << (ebits - 1)) - 1
    if fn and e == (1 << ebits) - 1 and m == (1 << mbits) - 1:
        return None  # e4m3fn: S.1111.111 is NaN, no infinities
    if not fn and e == (1 << ebits) - 1:
        return None  # e5m2: inf / NaN
    v = (m / (1 << mbits)) * 2.0 ** (1 - bias) if e == 0 else (1 + m / (1 << mbits)) * 2.0 ** (e - bias)
    return sign * v


def grid(ebits, mbits, fn):
    vals = [(decode(c, ebits, mbits, fn), c) for c in range(128)]  # the non-negative codes
    return sorted((v, c) for v, c in vals if v is not None)


def round_to(v, g):
    if math.isnan(v):
        return v
    a = abs(v)
    mx = g[-1][0]
    if a > mx:
        return math.copysign(mx, v)
    best = None
    for val, code in g:
        d = abs(val - a)
        if best is None or d < best[0] or (d == best[0] and code % 2 == 0):
            best = (d, val, code)
    return math.copysign(best[1], v)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def inputs():
    xs = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 448.0, 449.0, 464.0, 465.0, 480.0, 500.0, -1e6,
          57344.0, 57345.0, 61440.0, 61441.0, 1e30]
    for fmt in ((4, 3, True), (5, 2, False)):  # every value, the midpoints (ties) and their neighbours
        g = grid(*fmt)
        for (v0, _), (v1, _) in zip(g, g[1:]):
            mid = (v0 + v1) / 2
            for x in (v0, v1, mid, np.nextafter(np.float32(mid), np.float32(0)), np.nextafter(np.float32(mid), np.float32(1e38))):
                xs += [float(x), -float(x)]
    rng = np.random.default_rng(7)
    xs += list(rng.standard_normal(2000).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 18, 2000))
    return [f32(float(x)) for x in xs]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/fp8/rounding.tsv"
    g4, g5 = grid(4, 3, True), grid(5, 2, False)
    assert g4[-1][0] == 448.0 and g5[-1][0] == 57344.0
    seen, lines = set(), []
    for x in inputs():
        if bits(x) in seen:
            continue
        seen.add(bits(x))
        lines.append("%08x\t%08x\t%08x" % (bits(x), bits(f32(round_to(x, g4))), bits(f32(round_to(x, g5)))))
    with open(out, "w") as f:
        f.write("# in\te4m3\te5m2 (float32 bits; tests/oracle/fp8_ref.py)\n")
        f.write("\n".join(lines) + "\n")
    print(f"{len(lines)} values -> {out}")


if __name__ == "__main__":
    main()
