#!/usr/bin/python3
"""FP8 blockwise-scaling oracle (--fp8-recipe blockwise: DeepSeek-V3's 1x128 / 128x128 tiles, Transformer Engine's
Float8BlockScaling with power-of-2 scales) in float64 numpy, written from the definitions — independent of the C++
emulation (kernels/cpu/fp8_block.cpp): the fp8 grids are decoded from the formats' bit layouts (tests/oracle/fp8_ref.py)
and each value is rounded to the nearest grid value, ties to the even code; a block's scale is the float32 quotient
fp8_max / amax rounded down to a power of 2 (Transformer Engine's rule), 1 for an all-zero block; x * s and q * 1/s are
exact (powers of 2).

Usage: fp8_block_ref.py IN OUT N IN_F OUT_F DY_FORMAT(e4m3|e5m2)
  IN:  float32 little-endian x [N, IN_F], w [OUT_F, IN_F], dy [N, OUT_F]
  OUT: float64 little-endian, in order:
       x 1x128 (tiles along IN_F): q [N, IN_F], scale_inv [N, IN_F/128]
       w 128x128:                  q [OUT_F, IN_F], scale_inv [OUT_F/128, IN_F/128]
       dy 1x128 (along OUT_F):     q [N, OUT_F], scale_inv [N, OUT_F/128]
       x 128x1 (along N):          q [N, IN_F], scale_inv [N/128, IN_F]
       dy 128x1 (along N):         q [N, OUT_F], scale_inv [N/128, OUT_F]
       y = deq(x) deq(w)^T [N, OUT_F], and sum |deq(x)| |deq(w)|^T (the fp32 accumulation bound's scale)
       dx = deq(dy) deq(w) [N, IN_F], and its sum of |products|
       dw = deq'(dy)^T deq'(x) [OUT_F, IN_F] (the 128x1 tiles), and its sum of |products|
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_ref import grid  # noqa: E402  (the formats' decoded values, by their definition)

FORMATS = {"e4m3": (4, 3, True), "e5m2": (5, 2, False)}


def round_fp8(v, fmt):
    """v (float64 array, |v| <= the format's max) rounded to the nearest fp8 value, ties to the even code."""
    g = grid(*FORMATS[fmt])
    vals = np.array([val for val, _ in g])
    codes = np.array([code for _, code in g])
    a = np.abs(v)
    assert (a <= vals[-1]).all()
    hi = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo = hi - 1
    dlo, dhi = a - vals[lo], vals[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (codes[hi] % 2 == 0))
    return np.copysign(np.where(pick_hi, vals[hi], vals[lo]), v)


def block_scale(amax, fmt):
    """Transformer Engine's compute_scale_from_amax: the float32 quotient fp8_max / amax (FLT_MAX past float32's
    range), then its mantissa cleared (the power of 2 at or below it; frexp is exact); 1 where amax is 0."""
    fp8_max = np.float32(grid(*FORMATS[fmt])[-1][0])
    s = np.ones_like(amax)
    nz = amax > 0
    with np.errstate(over="ignore"):
        q = fp8_max / amax[nz].astype(np.float32)  # amax is a float32 input value: exact
    q = np.where(np.isinf(q), np.finfo(np.float32).max, q).astype(np.float64)
    _, e = np.frexp(q)  # q = m 2^e, m in [0.5, 1)
    s[nz] = np.ldexp(1.0, e - 1)
    return s


def quantize(x, br, bc, fmt):
    """x [R, C] in br x bc blocks -> q [R, C], scale_inv [R/br, C/bc]."""
    r, c = x.shape
    blocks = np.abs(x).reshape(r // br, br, c // bc, bc)
    s = block_scale(blocks.max(axis=(1, 3)), fmt)
    s_full = np.repeat(np.repeat(s, br, axis=0), bc, axis=1)
    return round_fp8(x * s_full, fmt), 1.0 / s


def deq(q, inv, br, bc):
    return q * np.repeat(np.repeat(inv, br, axis=0), bc, axis=1)


def main(argv):
    if len(argv) != 7:
        sys.exit(__doc__)
    n, fin, fout = int(argv[3]), int(argv[4]), int(argv[5])
    dyf = argv[6]
    data = np.fromfile(argv[1], dtype="<f4").astype(np.float64)
    if data.size != n * fin + fout * fin + n * fout:
        sys.exit(f"fp8_block_ref.py: {argv[1]} holds {data.size} floats")
    x = data[: n * fin].reshape(n, fin)
    w = data[n * fin: n * fin + fout * fin].reshape(fout, fin)
    dy = data[n * fin + fout * fin:].reshape(n, fout)
    out = []
    qx, sx = quantize(x, 1, 128, "e4m3")
    qw, sw = quantize(w, 128, 128, "e4m3")
    qdy, sdy = quantize(dy, 1, 128, dyf)
    qxc, sxc = quantize(x, 128, 1, "e4m3")
    qdyc, sdyc = quantize(dy, 128, 1, dyf)
    out += [qx, sx, qw, sw, qdy, sdy, qxc, sxc, qdyc, sdyc]
    dx_, dw_, ddy = deq(qx, sx, 1, 128), deq(qw, sw, 128, 128), deq(qdy, sdy, 1, 128)
    dxc, ddyc = deq(qxc, sxc, 128, 1), deq(qdyc, sdyc, 128, 1)
    out += [dx_ @ dw_.T, np.abs(dx_) @ np.abs(dw_).T]
    out += [ddy @ dw_, np.abs(ddy) @ np.abs(dw_)]
    out += [ddyc.T @ dxc, np.abs(ddyc).T @ np.abs(dxc)]
    np.concatenate([a.ravel() for a in out]).astype("<f8").tofile(argv[2])


if __name__ == "__main__":
    main(sys.argv)
