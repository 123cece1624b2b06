#!/usr/bin/python3
"""ref_dequant.py - tide's own numpy dequantiser of the ggml block formats, written from the
format descriptions (not from any implementation's code), used as the reference for
src/engine/quants.c.

Usage: ref_dequant.py FILE
FILE holds records written by tests/unit/test_quants.c: u32 type, u32 n (values), u64 nbytes,
the nbytes of blocks, then tide's n dequantised values as f32. Every value must match this
reference bit for bit (each float operation is done in float32, in the format's order).
Exit status 0 when all match; otherwise the first mismatches are printed."""
import struct
import sys

import numpy as np

F32 = np.float32
IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=F32)
FP4X2 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=F32)


def f16(b, off):
    """Column of f16 values at byte offset off of every block (b: blocks x bytes)."""
    return b[:, off:off + 2].copy().view(np.float16).astype(F32)[:, 0]


def nibbles(q):
    """16 bytes per row -> 32 values: low nibbles first, then high."""
    return np.concatenate([q & 0x0F, q >> 4], axis=1).astype(np.int32)


def bits32(b, off):
    """The u32 at off as 32 columns of bits (bit j in column j)."""
    u = b[:, off:off + 4].copy().view('<u4')[:, 0]
    return ((u[:, None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int32)


def k_scales(sc):
    """q4_K / q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins."""
    s = np.zeros((sc.shape[0], 8), dtype=np.int32)
    m = np.zeros_like(s)
    sc = sc.astype(np.int32)
    s[:, :4] = sc[:, 0:4] & 63
    m[:, :4] = sc[:, 4:8] & 63
    s[:, 4:] = (sc[:, 8:12] & 0x0F) | ((sc[:, 0:4] >> 6) << 4)
    m[:, 4:] = (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)
    return s.astype(F32), m.astype(F32)


def deq(t, b):
    nb = b.shape[0]
    if t == 8:  # q8_0
        return (f16(b, 0)[:, None] * b[:, 2:34].view(np.int8).astype(F32)).ravel()
    if t == 2:  # q4_0
        return (f16(b, 0)[:, None] * (nibbles(b[:, 2:18]) - 8).astype(F32)).ravel()
    if t in (6, 7):  # q5_0, q5_1
        o = 2 if t == 6 else 4
        q = nibbles(b[:, o + 4:o + 20]) | (bits32(b, o) << 4)
        d = f16(b, 0)[:, None]
        if t == 6:
            return ((q - 16).astype(F32) * d).ravel()
        return (q.astype(F32) * d + f16(b, 2)[:, None]).ravel()
    if t == 39:  # mxfp4: 2^(e-128) times the doubled e2m1 codes
        e = b[:, 0].astype(np.uint32)
        bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
        d = bits.view(F32)[:, None]
        return (FP4X2[nibbles(b[:, 1:17])] * d).ravel()
    if t in (12, 13):  # q4_K, q5_K
        d, dmin = f16(b, 0), f16(b, 2)
        s, m = k_scales(b[:, 4:16])
        ds, dm = d[:, None] * s, dmin[:, None] * m  # (nb, 8)
        qs = b[:, 16:144] if t == 12 else b[:, 48:176]
        out = np.zeros((nb, 256), dtype=F32)
        for c in range(4):
            q = qs[:, 32 * c:32 * c + 32].astype(np.int32)
            lo, hi = q & 0x0F, q >> 4
            if t == 13:
                qh = b[:, 16:48].astype(np.int32)
                lo = lo | (((qh >> (2 * c)) & 1) << 4)
                hi = hi | (((qh >> (2 * c + 1)) & 1) << 4)
            out[:, 64 * c:64 * c + 32] = ds[:, 2 * c:2 * c + 1] * lo.astype(F32) - dm[:, 2 * c:2 * c + 1]
            out[:, 64 * c + 32:64 * c + 64] = ds[:, 2 * c + 1:2 * c + 2] * hi.astype(F32) - dm[:, 2 * c + 1:2 * c + 2]
        return out.ravel()
    if t == 14:  # q6_K
        d = f16(b, 208)[:, None]
        sc = b[:, 192:208].view(np.int8).astype(F32)
        out = np.zeros((nb, 256), dtype=F32)
        for h in range(2):
            ql = b[:, 64 * h:64 * h + 64].astype(np.int32)
            qh = b[:, 128 + 32 * h:160 + 32 * h].astype(np.int32)
            parts = [(ql[:, :32] & 0x0F) | ((qh & 3) << 4),
                     (ql[:, 32:] & 0x0F) | (((qh >> 2) & 3) << 4),
                     (ql[:, :32] >> 4) | (((qh >> 4) & 3) << 4),
                     (ql[:, 32:] >> 4) | (((qh >> 6) & 3) << 4)]
            for k, q in enumerate(parts):
                for half in range(2):  # a scale per 16 values
                    s = sc[:, 8 * h + 2 * k + half][:, None]
                    out[:, 128 * h + 32 * k + 16 * half:128 * h + 32 * k + 16 * half + 16] = \
                        d * s * (q[:, 16 * half:16 * half + 16] - 32).astype(F32)
        return out.ravel()
    if t == 23:  # iq4_xs
        d = f16(b, 0)
        sh = b[:, 2:4].copy().view('<u2')[:, 0].astype(np.int32)
        out = np.zeros((nb, 256), dtype=F32)
        for j in range(8):
            ls = ((b[:, 4 + j // 2].astype(np.int32) >> (4 * (j % 2))) & 0x0F) | (((sh >> (2 * j)) & 3) << 4)
            dl = (d * (ls - 32).astype(F32))[:, None]
            out[:, 32 * j:32 * j + 32] = dl * IQ4NL[nibbles(b[:, 8 + 16 * j:24 + 16 * j])]
        return out.ravel()
    raise ValueError(f"type {t} unknown to the reference")


BLOCK = {8: (32, 34), 2: (32, 18), 6: (32, 22), 7: (32, 24), 39: (32, 17),
         12: (256, 144), 13: (256, 176), 14: (256, 210), 23: (256, 136)}


def main():
    data = open(sys.argv[1], 'rb').read()
    pos, bad, checked = 0, 0, []
    while pos < len(data):
        t, n, nbytes = struct.unpack_from('<IIQ', data, pos)
        pos += 16
        vals, bb = BLOCK[t]
        assert nbytes == n // vals * bb, f"type {t}: {nbytes} bytes for {n} values"
        blocks = np.frombuffer(data, np.uint8, nbytes, pos).reshape(-1, bb)
        pos += nbytes
        tide = np.frombuffer(data, '<u4', n, pos)
        pos += 4 * n
        ref = deq(t, blocks).astype(F32).view('<u4')
        diff = np.nonzero(ref != tide)[0]
        if len(diff):
            bad += 1
            i = diff[0]
            print(f"type {t}: {len(diff)} of {n} values differ; first at {i}: "
                  f"tide {tide[i:i+1].view(F32)[0]!r} reference {ref[i:i+1].view(F32)[0]!r}")
        checked.append(f"{t}:{n}")
    print(f"ref_dequant: {len(checked)} records ({' '.join(checked)}), {bad} with differences")
    return 1 if bad or not checked else 0


if __name__ == '__main__':
    sys.exit(main())
