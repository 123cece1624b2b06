#!/usr/bin/python3
"""qwen25vl-ref.py - a float64 numpy reference of the Qwen2.5-VL vision tower (qwen2.5vl_merger),
to tell which side of scripts/check-mtmd-parity.sh is off (issue 25).

Written from the architecture (docs/VISION.md "Qwen2-VL and Qwen2.5-VL"), not from either
implementation's order of operations: the patches stay in the image's row-major order and the
windowed blocks use a mask (same window or not) instead of llama.cpp's and tide's reordering,
so a window-ordering slip on either side shows. Every weight is read from the mmproj as float64.
Steps: normalised pixels -> conv of the two temporal kernels summed -> blocks of (RMSNorm ->
q, k, v -> 2-D rope (first quarter of each head's pairs rotated by the patch row, the second by
its column, theta 10000^(-4j/hd), pairs (i, i + hd/2)) -> softmax(q k / sqrt(hd)) within the
window or the whole image -> out -> residual -> RMSNorm -> down(silu(gate) * up) -> residual)
-> post RMSNorm -> the four patches of each 2x2 merged token side by side -> mm.0 -> GELU (tanh
form, as ggml_gelu; GELU=erf for the exact one) -> mm.2, merged tokens in row-major order.

Usage: qwen25vl-ref.py MMPROJ IMAGE.ppm OUT.txt   (IMAGE: tide-embd's TIDE_EMBD_PPM, already of
a valid size); OUT has the format of tide-embd / mtmd-embd (count, width, then one float a line).
Compare: qwen25vl-ref.py --cmp REF.txt A.txt [B.txt ...] prints each one's relative RMS to REF.
Run with /usr/bin/python3 (it has numpy). F16=a,b,... in the environment adds llama.cpp's f16
steps on a CPU, to show where libmtmd's difference comes from: conv (ggml_conv_2d's f16 im2col:
pixels and kernels rounded to f16, f32 sums), conv-acc (the same with ggml_vec_dot_f16's f16
accumulation, what an AVX512-FP16 build does at patch 14), gelu (ggml's f16 GELU table).
What it found (issue 25, docs/VISION.md): tide is within 4e-7 of this reference on every image
of the parity check, libmtmd 6.4e-4 to 1.01e-3 off; F16=conv-acc,gelu reproduces libmtmd to
1e-6 to 4e-5.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train"))
import gguf_read  # noqa: E402


def read_ppm(path):
    data = open(path, "rb").read()
    parts, pos = [], 0
    while len(parts) < 4:  # P6, width, height, maxval, each after whitespace
        while data[pos:pos + 1].isspace():
            pos += 1
        end = pos
        while not data[end:end + 1].isspace():
            end += 1
        parts.append(data[pos:end])
        pos = end
    w, h = int(parts[1]), int(parts[2])
    return np.frombuffer(data[pos + 1:pos + 1 + w * h * 3], dtype=np.uint8).reshape(h, w, 3), w, h


def rope(x, py, px, hd):
    """x: (n, H, hd); rotate pairs (i, i + hd/2); i < hd/4 by row, else by column."""
    half, quarter = hd // 2, hd // 4
    i = np.arange(half)
    j = np.where(i < quarter, i, i - quarter)
    freq = 10000.0 ** (-4.0 * j / hd)
    p = np.where(i[None, :] < quarter, py[:, None], px[:, None]).astype(np.float64)
    a = p * freq[None, :]
    cs, sn = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * cs - x1 * sn, x0 * sn + x1 * cs], axis=-1)


def f16r(v):
    """v rounded to f16 and back (llama.cpp's f16 steps, for the experiments of F16=...)"""
    return v.astype(np.float16).astype(np.float64)


def dot_f16_acc(X, Y):
    """ggml_vec_dot_f16 as built for an AVX512-FP16 CPU (GGML_NATIVE), rows of X . rows of Y (f16
    values): 4 accumulators of 32 half lanes over the first K & ~127 terms, each step a fused
    multiply-add rounded to f16, the accumulators and then the lanes added in f16 (halves), the
    last K % 128 terms in double; the result stored as f32. ggml_mul_mat takes this path for an
    f16 src0 when tinyBLAS refuses it (k % 16 != 0: 3 * 14 * 14 = 588)."""
    n, K = X.shape
    top = K & ~127
    acc = np.zeros((n, Y.shape[0], 4, 32))
    for i in range(0, top, 128):
        for j in range(4):
            a, b = X[:, i + 32 * j:i + 32 * j + 32], Y[:, i + 32 * j:i + 32 * j + 32]
            acc[:, :, j] = f16r(acc[:, :, j] + a[:, None, :] * b[None, :, :])
    s = f16r(f16r(acc[:, :, 0] + acc[:, :, 2]) + f16r(acc[:, :, 1] + acc[:, :, 3]))
    while s.shape[-1] > 1:
        half = s.shape[-1] // 2
        s = f16r(s[..., :half] + s[..., half:])
    return (s[..., 0] + X[:, top:] @ Y[:, top:].T).astype(np.float32).astype(np.float64)


def encode(mmproj, ppm, gelu_erf=False, f16=(), trace=None):
    kv, t = gguf_read.read(mmproj)
    W = {k: v.astype(np.float64) for k, v in t.items()}
    p = kv["clip.vision.patch_size"]
    D = kv["clip.vision.embedding_length"]
    H = kv["clip.vision.attention.head_count"]
    L = kv["clip.vision.block_count"]
    eps = kv["clip.vision.attention.layer_norm_epsilon"]
    wa = kv["clip.vision.n_wa_pattern"]
    mean = np.array(kv["clip.vision.image_mean"], dtype=np.float64)
    std = np.array(kv["clip.vision.image_std"], dtype=np.float64)
    G = 112 // (p * 2)  # a window's side in merged tokens
    img, w, h = read_ppm(ppm)
    gw, gh = w // p, h // p
    n, hd = gw * gh, D // H
    x01 = (img.astype(np.float64) / 255.0 - mean) / std  # (h, w, 3)
    # patches row-major: (n, 3, p, p) in the kernel's (channel, row, column) order
    pat = x01.reshape(gh, p, gw, p, 3).transpose(0, 2, 4, 1, 3).reshape(n, 3 * p * p)
    k0, k1 = (W["v.patch_embd.weight" + s].reshape(D, 3 * p * p) for s in ("", ".1"))
    if "conv" in f16 or "conv-acc" in f16:
        # llama.cpp: ggml_conv_2d's im2col is f16, so ggml_mul_mat converts the kernel to f16
        # too; one conv a temporal kernel, added in f32. The pixels as both sides normalise them (f32).
        px32 = ((img.astype(np.float32) / np.float32(255) - mean.astype(np.float32)) / std.astype(np.float32))
        pat16 = f16r(px32.reshape(gh, p, gw, p, 3).transpose(0, 2, 4, 1, 3).reshape(n, 3 * p * p).astype(np.float64))
        dot = dot_f16_acc if "conv-acc" in f16 else (lambda a, b: (a @ b.T).astype(np.float32).astype(np.float64))
        x = dot(pat16, f16r(k0)) + dot(pat16, f16r(k1))
    else:
        x = pat @ (k0 + k1).T
    tr = trace if trace is not None else {}
    tr["patch"] = x
    py, px = np.divmod(np.arange(n), gw)
    win = (py // 2 // G) * 10000 + (px // 2 // G)
    same_window = win[:, None] == win[None, :]

    def rms(v, w_):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w_

    def lin(v, stem):
        return v @ W[stem + ".weight"].T + W[stem + ".bias"]

    for l in range(L):
        b = "v.blk.%d." % l
        xn = rms(x, W[b + "ln1.weight"])
        q = rope(lin(xn, b + "attn_q").reshape(n, H, hd), py, px, hd)
        k = rope(lin(xn, b + "attn_k").reshape(n, H, hd), py, px, hd)
        v = lin(xn, b + "attn_v").reshape(n, H, hd)
        s = np.einsum("ihe,jhe->hij", q, k) / math.sqrt(hd)
        if (l + 1) % wa != 0:
            s = np.where(same_window[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ao = np.einsum("hij,jhe->ihe", s, v).reshape(n, D)
        x = x + lin(ao, b + "attn_out")
        xn = rms(x, W[b + "ln2.weight"])
        g = lin(xn, b + "ffn_gate")
        x = x + lin(g / (1 + np.exp(-g)) * lin(xn, b + "ffn_up"), b + "ffn_down")
    x = rms(x, W["v.post_ln.weight"])
    tr["post_ln"] = x
    # merged token (my, mx): its patches (2my, 2mx), (2my, 2mx+1), (2my+1, 2mx), (2my+1, 2mx+1)
    m = x.reshape(gh // 2, 2, gw // 2, 2, D).transpose(0, 2, 1, 3, 4).reshape(n // 4, 4 * D)
    y = lin(m, "mm.0")
    tr["mm0"] = y
    if "gelu" in f16:  # ggml's CPU GELU: a table of f16 inputs to f16 outputs
        y = f16r(y)
        y = f16r(0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3))))
    elif gelu_erf:
        y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    else:
        y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    return lin(y, "mm.2")


def load(path):
    a = open(path).read().split()
    return np.array([float(v) for v in a[2:]]).reshape(int(a[0]), int(a[1]))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--cmp":
        ref = load(sys.argv[2])
        for f in sys.argv[3:]:
            d = load(f) - ref
            print("%s: relative RMS %.3e to %s" % (f, math.sqrt((d * d).mean() / (ref * ref).mean()), sys.argv[2]))
        sys.exit(0)
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    out = encode(sys.argv[1], sys.argv[2], os.environ.get("GELU") == "erf", os.environ.get("F16", "").split(","))
    with open(sys.argv[3], "w") as f:
        f.write("%d %d\n" % out.shape)
        f.write("\n".join("%.17g" % v for v in out.ravel()) + "\n")
