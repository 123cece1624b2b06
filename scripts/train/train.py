"""train.py - trains tide's own tiny MoE vision-language model (PyTorch, one GPU).

The architecture is exactly what tide loads: a `llama` decoder with Mixtral-style experts
(RMSNorm, adjacent-pair RoPE, GQA, top-2 of 8 SwiGLU experts, softmax renormalised over
the chosen two) and a LLaVA-style ViT (pre/post LayerNorm, tanh GELU) with the `mlp`
projector, fed 64x64 images in 8x8 patches (64 image tokens). Data: scripts/train/shapes.py.
Writes weights.npz (matrices rounded to f16, as the GGUF stores them), refs.npz (reference
logits and image embeddings computed with those weights), loss.csv and eval.json to OUTDIR.
Usage: python3 train.py OUTDIR [steps]; then export_gguf.py turns weights.npz into GGUF.
"""
import json
import math
import multiprocessing as mp
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import shapes as S

from train_cfg import E, NL, NH, NKV, HD, FF, NX, NUSED, VD, VF, VH, VL, P, NP, CFG
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
SEQ = NP + 128  # the longest sample (three shapes named) fits
LR = float(os.environ.get("TRAIN_LR", "1e-3"))
AUX = float(os.environ.get("TRAIN_AUX", "0.5"))
dev = os.environ.get("TRAIN_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")


def sdpa(q, k, v, causal=False):
    """F.scaled_dot_product_attention (torch >= 2.0), or the same in plain ops (Debian's 1.13,
    for trying the scripts on a CPU)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[-2]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), -1).to(v.dtype) @ v


def autocast():
    """bf16 autocast on the GPU; none on a CPU (slow there, and only for trying the scripts)."""
    return torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda")


def P_(*shape, std=None):
    t = torch.randn(*shape) * (std if std is not None else 1.0 / math.sqrt(shape[-1]))
    return torch.nn.Parameter(t.to(dev))


def ones(n): return torch.nn.Parameter(torch.ones(n, device=dev))
def zeros(n): return torch.nn.Parameter(torch.zeros(n, device=dev))


def build():
    w = {"token_embd.weight": P_(S.N_VOCAB, E, std=0.5), "output_norm.weight": ones(E),
         "output.weight": P_(S.N_VOCAB, E)}
    for l in range(NL):
        b = "blk.%d." % l
        w[b + "attn_norm.weight"] = ones(E)
        w[b + "attn_q.weight"] = P_(NH * HD, E)
        w[b + "attn_k.weight"] = P_(NKV * HD, E)
        w[b + "attn_v.weight"] = P_(NKV * HD, E)
        w[b + "attn_output.weight"] = P_(E, NH * HD, std=0.5 / math.sqrt(E))
        w[b + "ffn_norm.weight"] = ones(E)
        w[b + "ffn_gate_inp.weight"] = P_(NX, E)
        w[b + "ffn_gate_exps.weight"] = P_(NX, FF, E)
        w[b + "ffn_up_exps.weight"] = P_(NX, FF, E)
        w[b + "ffn_down_exps.weight"] = P_(NX, E, FF, std=0.5 / math.sqrt(FF))
    w["v.patch_embd.weight"] = P_(VD, 3, P, P, std=1.0 / math.sqrt(3 * P * P))
    w["v.patch_embd.bias"] = zeros(VD)
    w["v.position_embd.weight"] = P_(NP, VD, std=0.1)
    w["v.pre_ln.weight"], w["v.pre_ln.bias"] = ones(VD), zeros(VD)
    for l in range(VL):
        b = "v.blk.%d." % l
        for n in ("ln1", "ln2"):
            w[b + n + ".weight"], w[b + n + ".bias"] = ones(VD), zeros(VD)
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w[b + n + ".weight"], w[b + n + ".bias"] = P_(VD, VD), zeros(VD)
        w[b + "ffn_up.weight"], w[b + "ffn_up.bias"] = P_(VF, VD), zeros(VF)
        w[b + "ffn_down.weight"], w[b + "ffn_down.bias"] = P_(VD, VF, std=0.5 / math.sqrt(VF)), zeros(VD)
    w["v.post_ln.weight"], w["v.post_ln.bias"] = ones(VD), zeros(VD)
    w["mm.0.weight"], w["mm.0.bias"] = P_(E, VD), zeros(E)
    w["mm.2.weight"], w["mm.2.bias"] = P_(E, E), zeros(E)
    # training only (never exported): linear probes on the mean image embedding that name the
    # shape, the colour (one-shape images) and the count, so the tower learns to see shapes
    # without waiting for the decoder's sparse answer-token signal
    w["train_aux.weight"], w["train_aux.bias"] = P_(len(S.SHAPES) + len(S.CNAMES) + 3, E), zeros(len(S.SHAPES) + len(S.CNAMES) + 3)
    return w


def vision(w, img):
    """img: (B, 3, 64, 64) normalised -> (B, NP, E) image embeddings."""
    x = F.conv2d(img, w["v.patch_embd.weight"], w["v.patch_embd.bias"], stride=P)
    x = x.flatten(2).transpose(1, 2) + w["v.position_embd.weight"]
    x = F.layer_norm(x, (VD,), w["v.pre_ln.weight"], w["v.pre_ln.bias"], 1e-5)
    B = x.shape[0]
    for l in range(VL):
        b = "v.blk.%d." % l
        h = F.layer_norm(x, (VD,), w[b + "ln1.weight"], w[b + "ln1.bias"], 1e-5)
        q, k, v = (F.linear(h, w[b + n + ".weight"], w[b + n + ".bias"]).view(B, NP, VH, -1).transpose(1, 2)
                   for n in ("attn_q", "attn_k", "attn_v"))
        a = sdpa(q, k, v).transpose(1, 2).reshape(B, NP, VD)
        x = x + F.linear(a, w[b + "attn_out.weight"], w[b + "attn_out.bias"])
        h = F.layer_norm(x, (VD,), w[b + "ln2.weight"], w[b + "ln2.bias"], 1e-5)
        h = F.gelu(F.linear(h, w[b + "ffn_up.weight"], w[b + "ffn_up.bias"]), approximate="tanh")
        x = x + F.linear(h, w[b + "ffn_down.weight"], w[b + "ffn_down.bias"])
    x = F.layer_norm(x, (VD,), w["v.post_ln.weight"], w["v.post_ln.bias"], 1e-5)
    x = F.gelu(F.linear(x, w["mm.0.weight"], w["mm.0.bias"]), approximate="tanh")
    return F.linear(x, w["mm.2.weight"], w["mm.2.bias"])


def rms(x, g): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g


def rope(x, pos):
    """x: (B, H, T, HD); adjacent pairs (2i, 2i+1), ggml's normal mode (llama)."""
    i = torch.arange(HD // 2, device=x.device, dtype=torch.float64)
    ang = (pos.double()[:, None] * 10000.0 ** (-2.0 * i / HD)).float()
    c, s = ang.cos(), ang.sin()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2).to(x.dtype)


def decoder(w, h):
    """h: (B, T, E) input embeddings -> logits (B, T, V)."""
    B, T, _ = h.shape
    pos = torch.arange(T, device=h.device)
    for l in range(NL):
        b = "blk.%d." % l
        x = rms(h, w[b + "attn_norm.weight"])
        q = F.linear(x, w[b + "attn_q.weight"]).view(B, T, NH, HD).transpose(1, 2)
        k = F.linear(x, w[b + "attn_k.weight"]).view(B, T, NKV, HD).transpose(1, 2)
        v = F.linear(x, w[b + "attn_v.weight"]).view(B, T, NKV, HD).transpose(1, 2)
        q, k = rope(q, pos), rope(k, pos)
        k, v = k.repeat_interleave(NH // NKV, 1), v.repeat_interleave(NH // NKV, 1)
        a = sdpa(q, k, v, True).transpose(1, 2).reshape(B, T, NH * HD)
        h = h + F.linear(a, w[b + "attn_output.weight"])
        x = rms(h, w[b + "ffn_norm.weight"])
        gl = F.linear(x, w[b + "ffn_gate_inp.weight"]).float()
        top, sel = gl.topk(NUSED, -1)
        gw = torch.zeros_like(gl).scatter(-1, sel, torch.softmax(top, -1))
        g = torch.einsum("bte,xfe->btxf", x, w[b + "ffn_gate_exps.weight"])
        u = torch.einsum("bte,xfe->btxf", x, w[b + "ffn_up_exps.weight"])
        y = torch.einsum("btxf,xef->btxe", F.silu(g) * u, w[b + "ffn_down_exps.weight"])
        h = h + (y * gw[..., None].to(y.dtype)).sum(2)
        # a light load-balancing term (Switch-style) so that all experts get used
        decoder.aux = decoder.aux + NX * (torch.softmax(gl, -1).mean((0, 1)) *
                                          (gw > 0).float().mean((0, 1))).sum() / NL
    return F.linear(rms(h, w["output_norm.weight"]), w["output.weight"])


decoder.aux = 0.0


def forward(w, ids, imgs, want_embd=False):
    """ids: (B, T) with S.IMG at image positions; imgs: (Bi, 3, 64, 64) for the rows that have them."""
    h = w["token_embd.weight"][ids.clamp(min=0)]
    m = ids == S.IMG
    emb = None
    if imgs is not None and imgs.shape[0]:
        h = h.clone()
        emb = vision(w, imgs)
        h[m] = emb.reshape(-1, E).to(h.dtype)
    out = decoder(w, h)
    return (out, emb) if want_embd else out


def aux_loss(w, emb, labels):
    """labels: (Bi, 3) shape, colour (-100 when several shapes) and count-1 per image."""
    z = F.linear(emb.float().mean(1), w["train_aux.weight"], w["train_aux.bias"])
    ns, nc = len(S.SHAPES), len(S.CNAMES)
    return (F.cross_entropy(z[:, :ns], labels[:, 0], ignore_index=-100) +
            F.cross_entropy(z[:, ns:ns + nc], labels[:, 1], ignore_index=-100) +
            F.cross_entropy(z[:, ns + nc:], labels[:, 2]))


def norm_img(u8):
    x = torch.from_numpy(u8).to(dev).permute(0, 3, 1, 2).float() / 255.0
    return (x - MEAN.to(dev)) / STD.to(dev)


def sample(seed):
    """One training example: (ids, loss mask, image or None)."""
    rng = np.random.default_rng(seed)
    if rng.random() < 0.8:
        img, objs = S.make_image(rng)
        q, a = S.image_qa(rng, objs)
        p = S.prompt_ids(q, True, NP)
        lab = (S.SHAPES.index(objs[0][1]) if len(objs) == 1 else -100,
               S.CNAMES.index(objs[0][0]) if len(objs) == 1 else -100, len(objs) - 1)
    else:
        img, lab = None, None
        q, a = S.text_chat(rng)
        p = S.prompt_ids(q, False, NP)
    ans = S.answer_ids(a)
    return p + ans, len(p), img, lab


def batches(n, base):
    with mp.Pool(min(16, os.cpu_count() or 1)) as pool:
        data = pool.map(sample, range(base, base + n), chunksize=512)
    return data


def collate(items):
    B = len(items)
    ids = np.full((B, SEQ + 1), S.EOT, np.int64)
    lm = np.zeros((B, SEQ + 1), np.float32)
    imgs, labs = [], []
    for i, (seq, np_, img, lab) in enumerate(items):
        seq = seq[:SEQ + 1]
        ids[i, :len(seq)] = seq
        lm[i, np_:len(seq)] = 1
        if img is not None:
            imgs.append(img)
            labs.append(lab)
    ids = torch.from_numpy(ids).to(dev)
    lm = torch.from_numpy(lm).to(dev)
    im = norm_img(np.stack(imgs)) if imgs else None
    lab = torch.tensor(labs, device=dev) if labs else None
    return ids, lm, im, lab


@torch.no_grad()
def greedy(w, prompts, imgs, n=48):
    ids = torch.tensor(prompts, device=dev)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=dev)
    out = [[] for _ in prompts]
    for _ in range(n):
        t = forward(w, ids, imgs)[:, -1].argmax(-1)
        for i, v in enumerate(t.tolist()):
            if not done[i] and v < 256:  # bytes only; an untrained model may emit other specials
                out[i].append(v)
        done |= t == S.IM_END
        ids = torch.cat([ids, t[:, None]], 1)
        if done.all():
            break
    return [bytes(o).decode("utf-8", "replace") for o in out]


def evaluate(w, seed0, n=128):
    res = {}
    rng = np.random.default_rng(seed0)
    for q, nobj in ((S.Q_WHAT, 1), (S.Q_COUNT, None), (S.Q_COLOUR, 1), (S.Q_SHAPE, 1)):
        ims, exp = [], []
        for _ in range(n):
            img, objs = S.make_image(rng, nobj)
            ims.append(img)
            exp.append(objs)
        got = greedy(w, [S.prompt_ids(q, True, NP)] * n, norm_img(np.stack(ims)))
        ok = 0
        for g, o in zip(got, exp):
            if q == S.Q_COUNT:
                ok += S.NUM[len(o)] in g
            else:
                ok += (q != S.Q_SHAPE or o[0][1] in g) and (q != S.Q_COLOUR or o[0][0] in g) and \
                    (q != S.Q_WHAT or (o[0][0] in g and o[0][1] in g))
        res[q] = ok / n
        res[q + " sample"] = got[:3]
    return res


@torch.no_grad()
def reference_vectors(w):
    """A text prompt's last logits, an image's embeddings, an image prompt's logits (refs.npz,
    for make_refs.py)."""
    rng = np.random.default_rng(424242)
    img, objs = S.make_image(rng, 1)
    emb = vision(w, norm_img(img[None]))[0]
    tp = S.prompt_ids("What is 3 + 4?", False, NP)
    tl = forward(w, torch.tensor([tp], device=dev), None)[0, -1]
    ip = S.prompt_ids(S.Q_WHAT, True, NP)
    il = forward(w, torch.tensor([ip], device=dev), norm_img(img[None]))[0, -1]
    return dict(image=img, image_embd=emb.cpu().numpy(), text_ids=np.array(tp), text_logits=tl.cpu().numpy(),
                image_ids=np.array(ip), image_logits=il.cpu().numpy())


def main():
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    w = build()
    opt = torch.optim.AdamW(w.values(), lr=LR, betas=(0.9, 0.98), weight_decay=0.01)
    t0 = time.time()
    BS = 128
    cap = float(os.environ.get("TRAIN_SECONDS", "140"))
    n_data = min(steps * BS, int(os.environ.get("TRAIN_SAMPLES", "160000")))
    data = batches(n_data, 1000)  # training seeds 1000 .. 161000; the tests use seeds >= 10^9
    tgen = time.time() - t0
    log, skipped = [], 0
    t1 = time.time()
    for step in range(steps):
        # the schedule follows whichever of steps and the time cap ends the run first, so a run
        # cut by the cap still finishes its cosine
        prog = min(1.0, max(step / steps, (time.time() - t1) / max(1.0, cap - tgen)))
        lr = LR * min(1.0, (step + 1) / 300) * (0.5 * (1 + math.cos(math.pi * prog)) * 0.95 + 0.05)
        for gp in opt.param_groups:
            gp["lr"] = lr
        o = (step * BS) % (n_data - BS)
        ids, lm, im, lab = collate(data[o:o + BS])
        decoder.aux = 0.0
        with autocast():
            logits, emb = forward(w, ids[:, :-1], im, True)
        ce = F.cross_entropy(logits.float().reshape(-1, S.N_VOCAB), ids[:, 1:].reshape(-1), reduction="none",
                             ignore_index=S.IMG)  # image positions are masked out of the loss anyway
        loss = (ce * lm[:, 1:].reshape(-1)).sum() / lm[:, 1:].sum()
        total = loss + 0.01 * decoder.aux
        if AUX > 0 and emb is not None:
            total = total + AUX * aux_loss(w, emb, lab)
        if not torch.isfinite(total):  # a bad step is skipped, never applied
            skipped += 1
            opt.zero_grad(set_to_none=True)
            continue
        total.backward()
        torch.nn.utils.clip_grad_norm_(w.values(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == steps - 1:
            log.append((step, loss.item()))
            print("step %d loss %.4f lr %.2e %.1fs" % (step, loss.item(), lr, time.time() - t0), flush=True)
        if time.time() - t0 > cap or prog >= 1.0:
            break
    ttrain = time.time() - t0
    torch.backends.cuda.matmul.allow_tf32 = False
    # round matrices to f16 as the GGUF stores them; vectors (and the router) stay f32
    with torch.no_grad():
        for k, v in w.items():
            if v.dim() >= 2 and "ffn_gate_inp" not in k:
                v.copy_(v.half().float())
    np.savez_compressed(os.path.join(out, "weights.npz"),
             **{k: v.detach().cpu().numpy() for k, v in w.items() if not k.startswith("train_aux.")})
    with open(os.path.join(out, "cfg.json"), "w") as f:
        json.dump(dict(CFG, LR=LR, AUX=AUX), f)
    with open(os.path.join(out, "loss.csv"), "w") as f:
        f.write("step,loss\n" + "".join("%d,%.5f\n" % s for s in log))
    np.savez(os.path.join(out, "refs.npz"), **reference_vectors(w))
    ev = evaluate(w, 10**9 + 7)
    ev.update(train_s=ttrain, datagen_s=tgen, steps=step + 1, batch=BS, skipped=skipped, samples=n_data,
              cfg=dict(CFG, LR=LR, AUX=AUX))
    print(json.dumps(ev, indent=1), flush=True)
    with open(os.path.join(out, "eval.json"), "w") as f:
        json.dump(ev, f, indent=1)


if __name__ == "__main__":
    main()
