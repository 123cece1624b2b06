#!/usr/bin/env python3
# emu-attention-full-mma.py - a numpy emulation of src/engine/cuda/attention_full_mma.cu's index
# math (each lane's mma.sync m16n8k16 fragments, the head padded to whole k steps, the K / V^T
# tiles in shared memory, the masks of the last key tile and of the rows past P, the online
# softmax), for checking the kernel where there is no GPU: shared memory starts as NaN except the
# padding the kernel zeroes, so a read of anything it did not write shows. Keep it in step with the
# kernel. Usage: /usr/bin/python3 scripts/emu-attention-full-mma.py P N_HEAD HEAD_DIM (Debian's
# python3-numpy); prints NaNs found and the relative RMS against f64 attention (f16 class: ~4e-4).
import numpy as np, sys
def mma(d, a, b0, b1):
    A = np.zeros((16,16), np.float32); B = np.zeros((16,8), np.float32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for j in range(2):
            A[g][2*t+j] = a[lane][0][j]; A[g+8][2*t+j] = a[lane][1][j]
            A[g][2*t+8+j] = a[lane][2][j]; A[g+8][2*t+8+j] = a[lane][3][j]
            B[2*t+j][g] = b0[lane][j]; B[2*t+8+j][g] = b1[lane][j]
    C = A.astype(np.float64) @ B.astype(np.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        d[lane][0] += C[g][2*t]; d[lane][1] += C[g][2*t+1]; d[lane][2] += C[g+8][2*t]; d[lane][3] += C[g+8][2*t+1]

def run(q, k, v, P, H, HD):
    A = H * HD
    out = np.full((P, A), np.nan, np.float32)
    HP = (HD + 15)//16*16; KS = HP//16; DT = HD//8; NT = 8; KLD = HP + 8; VLD = 72
    PAD = HP - HD if HP > HD else 1
    scale2 = 1.4426950408889634 / np.sqrt(HD)
    for h in range(H):
        qh = q.reshape(-1)[h*HD:]; kh = k.reshape(-1)[h*HD:]; vh = v.reshape(-1)[h*HD:]
        for bx in range((P + 63)//64):
            t0 = bx * 64
            ks = np.full(64*KLD, np.nan, np.float16); vt = np.full(HD*VLD, np.nan, np.float16)
            if HP > HD:
                for i in range(64*PAD): ks[(i//PAD)*KLD + HD + i % PAD] = 0
            W = []
            for warp in range(4):
                st = []
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    rr = [t0 + warp*16 + g, t0 + warp*16 + g + 8]
                    qa = np.zeros((KS,4,2), np.float16)
                    for s in range(KS):
                        for f in range(4):
                            row = rr[f & 1]; d = s*16 + 2*t + (f >> 1)*8
                            if row < P and d < HD:
                                qa[s][f] = qh[row*A + d: row*A + d + 2]
                    st.append(dict(rr=rr, qa=qa, m=[-np.inf]*2, l=[0.0]*2, o=np.zeros((DT,4))))
                W.append(st)
            for k0 in range(0, P, 64):
                for i in range(64*HD//4):
                    j = i // (HD//4); d4 = (i % (HD//4))*4
                    kv = kh[(k0+j)*A + d4:(k0+j)*A + d4 + 4] if k0 + j < P else np.zeros(4)
                    ks[j*KLD + d4: j*KLD + d4 + 4] = kv
                    jv = i % 64; dv = (i//64)*4
                    vv = vh[(k0+jv)*A + dv:(k0+jv)*A + dv + 4] if k0 + jv < P else np.zeros(4)
                    for e in range(4): vt[(dv+e)*VLD + jv] = vv[e]
                for warp in range(4):
                    st = W[warp]
                    s = np.zeros((32, NT, 4))
                    for j in range(NT):
                        for kk in range(KS):
                            a = [st[l]['qa'][kk] for l in range(32)]
                            b0 = []; b1 = []
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                base = (j*8 + g)*KLD
                                b0.append(ks[base + 2*(kk*8+t): base + 2*(kk*8+t) + 2])
                                b1.append(ks[base + 2*(kk*8+4+t): base + 2*(kk*8+4+t) + 2])
                            d = [s[l][j] for l in range(32)]
                            mma(d, a, b0, b1)
                    mx = np.full((32, 2), -np.inf)
                    for lane in range(32):
                        t = lane & 3
                        for j in range(NT):
                            for e in range(4):
                                key = k0 + j*8 + 2*t + (e & 1)
                                s[lane][j][e] = s[lane][j][e]*scale2 if key < P else -np.inf
                                mx[lane][e >> 1] = max(mx[lane][e >> 1], s[lane][j][e])
                    for lane in range(32):  # quad reduction
                        qd = lane & ~3
                        for hh in range(2):
                            mxq = max(mx[qd + x][hh] for x in range(4))
                            S = st[lane]
                            mn = max(S['m'][hh], mxq)
                            alpha = 1.0 if mn == -np.inf else 2.0**(S['m'][hh] - mn)
                            S['m'][hh] = mn; S['l'][hh] *= alpha
                            S['o'][:, 2*hh:2*hh+2] *= alpha
                    for lane in range(32):
                        S = st[lane]
                        for j in range(NT):
                            for e in range(4):
                                mn = S['m'][e >> 1]
                                p = 0.0 if mn == -np.inf else 2.0**(s[lane][j][e] - mn)
                                s[lane][j][e] = p; S['l'][e >> 1] += p
                    for kk in range(4):
                        a = []
                        for lane in range(32):
                            sl = s[lane]
                            a.append(np.array([[sl[2*kk][0], sl[2*kk][1]], [sl[2*kk][2], sl[2*kk][3]],
                                               [sl[2*kk+1][0], sl[2*kk+1][1]], [sl[2*kk+1][2], sl[2*kk+1][3]]], np.float16))
                        for dd in range(DT):
                            b0 = []; b1 = []
                            for lane in range(32):
                                g, t = lane >> 2, lane & 3
                                base = (dd*8 + g)*VLD
                                b0.append(vt[base + 2*(kk*8+t): base + 2*(kk*8+t) + 2])
                                b1.append(vt[base + 2*(kk*8+4+t): base + 2*(kk*8+4+t) + 2])
                            d = [st[l]['o'][dd] for l in range(32)]
                            mma(d, a, b0, b1)
            for warp in range(4):
                st = W[warp]
                for lane in range(32):
                    qd = lane & ~3; t = lane & 3
                    for hh in range(2):
                        l = sum(st[qd + x]['l'][hh] for x in range(4))
                        r = st[lane]['rr'][hh]
                        if r >= P: continue
                        for dd in range(DT):
                            out[r, h*HD + dd*8 + 2*t] = st[lane]['o'][dd][2*hh] / l
                            out[r, h*HD + dd*8 + 2*t + 1] = st[lane]['o'][dd][2*hh+1] / l
    return out

P, H, HD = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(1)
q = rng.standard_normal((P, H*HD)).astype(np.float32); k = rng.standard_normal((P, H*HD)).astype(np.float32); v = rng.standard_normal((P, H*HD)).astype(np.float32)
got = run(q, k, v, P, H, HD)
ref = np.zeros_like(got)
for h in range(H):
    sl = slice(h*HD, (h+1)*HD)
    sc = q[:, sl].astype(np.float64) @ k[:, sl].T.astype(np.float64) / np.sqrt(HD)
    sc = np.exp(sc - sc.max(1, keepdims=True)); sc /= sc.sum(1, keepdims=True)
    ref[:, sl] = sc @ v[:, sl]
print(P, H, HD, "nan:", np.isnan(got).sum(), "relRMS:", np.sqrt(((got-ref)**2).sum()/(ref**2).sum()))
