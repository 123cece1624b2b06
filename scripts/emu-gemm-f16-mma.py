#!/usr/bin/env python3
# emu-gemm-f16-mma.py - a numpy emulation of src/engine/cuda/gemm_f16_mma.cu's index math, for
# checking the kernel where there is no GPU: the plan (tile width, K slices), x's rounding kernel,
# each thread's cp.async granules (zero-filled past cols / rows / n) into the ring of stages, the
# cp.async groups landing as late as wait_group allows ("late") or at once ("early": a slot
# overwritten while still read shows), each lane's ldmatrix.x4 addresses and the registers the
# PTX ISA says it gets, the mma.sync m16n8k16 fragments (A row-major, B "col"), the epilogue's
# stores, the split-K partials and their fixed-order reduce, and add. Shared memory, the rounded
# x, y (without add) and the partials start as NaN and W's row padding is NaN, so a read of
# anything not written, or of the padding, shows as NaN in y. Also asserts that every ldmatrix
# row address is 16-byte aligned and inside its stage, every cp.async source inside its array
# and 16-byte aligned, and counts ldmatrix phases with shared-memory bank conflicts.
# Keep it in step with the kernel. Usage: /usr/bin/python3 scripts/emu-gemm-f16-mma.py [quick]
# (Debian's python3-numpy); prints each case's relative RMS against an f64 product of the
# rounded operands (f32 accumulation: ~1e-7) and exits 1 if any is off, NaN, or an assert fails.
import numpy as np, sys

BM, BK, LD, STAGES, THREADS, WM, WN, MAX_SPLIT, MIN_N = 128, 32, 40, 4, 256, 4, 2, 8, 64
GR = BK // 8

def round_to(v, ty):
    v = np.asarray(v, np.float32)
    if ty == 'f16':
        return v.astype(np.float16).astype(np.float32)
    u = v.view(np.uint32).astype(np.uint64)  # bf16, round to nearest even (no NaN inputs here)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)

def plan(sm_count, rows, cols, n, force_bn=0, split_limit=MAX_SPLIT):  # fm_plan_for
    rt = (rows + BM - 1) // BM
    bn = force_bn if force_bn else (128 if n > 64 and rt * ((n + 127) // 128) >= sm_count else 64)
    ctas = rt * ((n + bn - 1) // bn)
    nkt = (cols + BK - 1) // BK
    s = 1 if ctas >= sm_count else 2 * sm_count // ctas
    smax = nkt // STAGES if nkt // STAGES > 1 else 1
    s = min(s, smax, split_limit)
    kps = (nkt + s - 1) // s
    return bn, (nkt + kps - 1) // kps, kps

def convert(x, ty, mis):  # fm_convert_kernel: the VEC form when x is 16-byte aligned and total % 4 == 0
    total = x.size
    out = np.full(total, np.nan, np.float32)
    xf = x.reshape(-1)
    if not mis and total % 4 == 0:
        for i in range(total // 4):  # thread i: one float4 in, one ushort4 out
            out[4*i:4*i+4] = round_to(xf[4*i:4*i+4], ty)
    else:
        out[:] = round_to(xf, ty)
    return out

stats = {'ldsm': 0, 'conflicts': 0}

def ldsm_x4(smem, base_byte, addr, limit):
    # lane l supplies addr[l] (elements): row l % 8 of matrix l // 8; lane l gets, in register
    # j, row l // 4 of matrix j, elements 2(l % 4), 2(l % 4) + 1
    assert all(a % 8 == 0 for a in addr), "ldmatrix row not 16-byte aligned"
    assert all(0 <= a and a + 8 <= limit for a in addr), "ldmatrix row outside its stage"
    rowsv = np.stack([smem[a:a+8] for a in addr])  # (32, 8)
    for ph in range(4):  # one 8x8 matrix per phase: 8 rows x 4 words, 32 distinct banks wanted
        banks = [((base_byte + 2 * addr[8*ph + r]) // 4 + w) % 32 for r in range(8) for w in range(4)]
        stats['ldsm'] += 1
        stats['conflicts'] += len(banks) != len(set(banks))
    reg = np.zeros((32, 4, 2), np.float32)
    for l in range(32):
        for j in range(4):
            reg[l, j] = rowsv[8*j + l//4, 2*(l % 4): 2*(l % 4) + 2]
    return reg

lane = np.arange(32); G = lane >> 2; T = lane & 3

def mma(d, a, b0, b1):  # d (32, 4) += A(16x16) B(16x8) by the m16n8k16 fragment layout
    A = np.full((16, 16), np.nan); B = np.full((16, 8), np.nan)
    for j in range(2):
        A[G, 2*T+j] = a[:, 0, j]; A[G+8, 2*T+j] = a[:, 1, j]
        A[G, 2*T+8+j] = a[:, 2, j]; A[G+8, 2*T+8+j] = a[:, 3, j]
        B[2*T+j, G] = b0[:, j]; B[2*T+8+j, G] = b1[:, j]
    C = A @ B
    d[:, 0] = (d[:, 0] + C[G, 2*T]).astype(np.float32); d[:, 1] = (d[:, 1] + C[G, 2*T+1]).astype(np.float32)
    d[:, 2] = (d[:, 2] + C[G+8, 2*T]).astype(np.float32); d[:, 3] = (d[:, 3] + C[G+8, 2*T+1]).astype(np.float32)

def cta(Wf, ldw, rows, cols, x16, n, kps, out, add, bn, bx, by, bz, mode):
    MI, NJ = BM // WM // 16, bn // WN // 8
    sw = np.full((STAGES, BM * LD), np.nan, np.float32)
    sx = np.full((STAGES, bn * LD), np.nan, np.float32)
    x_base = STAGES * BM * LD * 2  # byte offset of fm_smem.x
    n0, m0 = bx * bn, by * BM
    nkt_all = (cols + BK - 1) // BK; kt0 = bz * kps; nkt = min(kps, nkt_all - kt0)
    pending = []

    def issue(kt, s):
        ops = []
        if kt < nkt:
            k0 = (kt0 + kt) * BK
            for tid in range(THREADS):
                for e in range(tid, BM * GR, THREADS):
                    r, k = e // GR, k0 + (e % GR) * 8
                    ok = m0 + r < rows and k < cols
                    src = (m0 + r) * ldw + k
                    if ok:
                        assert src % 8 == 0 and src + 8 <= Wf.size, "W granule outside W"
                    ops.append((sw, s, r * LD + (e % GR) * 8, Wf[src:src+8] if ok else np.zeros(8)))
                for e in range(tid, bn * GR, THREADS):
                    c, k = e // GR, k0 + (e % GR) * 8
                    ok = n0 + c < n and k < cols
                    src = (n0 + c) * cols + k
                    if ok:
                        assert src % 8 == 0 and src + 8 <= x16.size, "x granule outside x"
                    ops.append((sx, s, c * LD + (e % GR) * 8, x16[src:src+8] if ok else np.zeros(8)))
        pending.append(ops)  # commit: one group, empty past the end
        if mode == 'early':
            land(0)

    def land(keep):  # cp.async.wait_group keep: all but the newest keep groups complete
        while len(pending) > keep:
            for arr, s, off, v in pending.pop(0):
                arr[s, off:off+8] = v

    acc = np.zeros((WM * WN, 32, MI, NJ, 4), np.float32)
    for s in range(STAGES - 1):
        issue(s, s)
    for kt in range(nkt):
        slot = kt % STAGES
        land(STAGES - 2)
        # __syncthreads: every warp is done with stage kt - 1
        issue(kt + STAGES - 1, (kt + STAGES - 1) % STAGES)
        for warp in range(WM * WN):
            wm, wn = warp % WM, warp // WM
            a_row = wm * (MI * 16) + (lane & 15); a_k = (lane >> 4) * 8
            b_tok = wn * (NJ * 8) + (lane & 7) + (lane >> 4) * 8; b_k = ((lane >> 3) & 1) * 8
            for ks in range(BK // 16):
                a = [ldsm_x4(sw[slot], slot * BM * LD * 2, list((a_row + i * 16) * LD + ks * 16 + a_k), BM * LD)
                     for i in range(MI)]
                for j in range(0, NJ, 2):
                    b = ldsm_x4(sx[slot], x_base + slot * bn * LD * 2, list((b_tok + j * 8) * LD + ks * 16 + b_k),
                                bn * LD)
                    for i in range(MI):
                        mma(acc[warp, :, i, j], a[i], b[:, 0], b[:, 1])
                        mma(acc[warp, :, i, j + 1], a[i], b[:, 2], b[:, 3])
    land(0)
    y = out[bz]
    for warp in range(WM * WN):
        wm, wn = warp % WM, warp // WM
        for l in range(32):
            g, t = l >> 2, l & 3
            for i in range(MI):
                for j in range(NJ):
                    for e in range(4):
                        r = m0 + wm * (MI * 16) + i * 16 + g + (e >> 1) * 8
                        tk = n0 + wn * (NJ * 8) + j * 8 + 2 * t + (e & 1)
                        if r < rows and tk < n:
                            v = acc[warp, l, i, j, e]
                            y[tk * rows + r] = np.float32(y[tk * rows + r] + v) if add else v

def gemm(W, x, y0, ty, pad, mis, sm_count, force_bn, split_limit, mode):
    rows, cols = W.shape; n = x.shape[0]
    assert n >= MIN_N and cols % 8 == 0 and (cols + pad) % 8 == 0  # fm_takes
    ldw = cols + pad
    Wf = np.full(rows * ldw, np.nan, np.float32)
    for r in range(rows):
        Wf[r*ldw: r*ldw + cols] = W[r]
    x16 = convert(x, ty, mis)
    bn, splits, kps = plan(sm_count, rows, cols, n, force_bn, split_limit)
    add = y0 is not None
    ny = n * rows
    y = y0.reshape(-1).copy() if add else np.full(ny, np.nan, np.float32)
    out = [y] if splits == 1 else [np.full(ny, np.nan, np.float32) for _ in range(splits)]
    for bz in range(splits):
        for by in range((rows + BM - 1) // BM):
            for bx in range((n + bn - 1) // bn):
                cta(Wf, ldw, rows, cols, x16, n, kps, out, add and splits == 1, bn, bx, by, bz, mode)
    if splits > 1:  # fm_reduce_kernel
        for i in range(ny):
            s = out[0][i]
            for z in range(1, splits):
                s = np.float32(s + out[z][i])
            y[i] = np.float32(y[i] + s) if add else s
    return y.reshape(n, rows), (bn, splits, kps)

def main():
    quick = len(sys.argv) > 1 and sys.argv[1] == 'quick'
    # cols, rows, n, pad, misaligned x, sm_count, forced bn, split limit, type, add, mode
    cases = [
        (40, 70, 65, 8, 0, 132, 0, 8, 'f16', 0, 'late'),      # K of 1.25 stages, one row tile
        (136, 129, 130, 0, 1, 132, 128, 8, 'f16', 1, 'late'),  # rows / tokens one past a tile
        (136, 129, 130, 0, 1, 4, 64, 1, 'f16', 0, 'early'),
        (520, 200, 70, 16, 0, 132, 0, 8, 'f16', 1, 'early'),   # 17 stages, split-K 4 x 5 (last short)
        (520, 200, 70, 16, 0, 132, 0, 3, 'bf16', 0, 'late'),   # split 3 x 6 (last 5)
        (24, 1, 64, 0, 0, 132, 0, 8, 'f16', 0, 'late'),        # one row, K under a stage
        (264, 140, 200, 0, 0, 2, 128, 8, 'bf16', 1, 'late'),   # no split (few SMs), bn 128, 2 token tiles
    ]
    if quick:
        cases = cases[:2]
    # the plans of test-gpu's bench_f16_mma shapes on an H100 / H200 (132 SMs), for reading its numbers
    for cols, rows, n in [(1152, 1152, 3072), (1152, 3456, 3072), (1152, 4304, 3072), (4304, 1152, 3072),
                          (1152, 4304, 777), (4304, 1152, 777), (2048, 4096, 64), (4096, 2048, 64),
                          (2048, 4096, 512), (4096, 2048, 512)]:
        bn, splits, kps = plan(132, rows, cols, n)
        print(f"plan cols {cols} rows {rows} n {n}: tile 128 x {bn}, {((rows + BM - 1) // BM) * ((n + bn - 1) // bn)} "
              f"CTAs x {splits} K slices of {kps} stages")
    rng = np.random.default_rng(7)
    bad = 0
    for cols, rows, n, pad, mis, sm, fbn, sl, ty, add, mode in cases:
        W = round_to(rng.standard_normal((rows, cols)) / np.sqrt(cols), ty)
        x = rng.standard_normal((n, cols)).astype(np.float32)
        y0 = rng.standard_normal((n, rows)).astype(np.float32) if add else None
        got, p = gemm(W, x, y0, ty, pad, mis, sm, fbn, sl, mode)
        ref = round_to(x, ty).astype(np.float64) @ W.astype(np.float64).T  # (n, rows)
        if add:
            ref = ref + y0
        nan = int(np.isnan(got).sum())
        rel = float(np.sqrt(((got - ref) ** 2).sum() / (ref ** 2).sum())) if not nan else float('inf')
        ok = nan == 0 and rel < 1e-6
        bad += not ok
        print(f"cols {cols} rows {rows} n {n} pad {pad} mis {mis} {ty} add {add} {mode}: bn {p[0]} splits {p[1]} "
              f"kps {p[2]}  nan {nan}  relRMS {rel:.3g}  {'ok' if ok else 'BAD'}", flush=True)
    print(f"ldmatrix phases {stats['ldsm']}, with bank conflicts {stats['conflicts']} (the row padding's purpose: 0)")
    bad += stats['conflicts'] > 0
    print("FAILED" if bad else "all cases agree")
    sys.exit(1 if bad else 0)

main()
