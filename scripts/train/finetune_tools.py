"""finetune_tools.py - teaches tide's shipped model one tool call (issue 23): get_shape_count(colour).

Starts from models/tide-shapes.gguf + models/tide-shapes-mmproj.gguf (read back by
gguf_read.py) and trains the decoder only: the vision tower and projector stay as shipped, so
the image embeddings (and tests/unit/test_model_refs.c's reference) do not change. Each batch
mixes
 - train.py's own samples (no tools), so what the model knew stays (the accuracy bars), and
 - conversations with the tool offered, rendered as tide renders them (shapes.render_chat, the
   Python twin of the chat template shapes.CHAT_TEMPLATE that the exported GGUF carries):
   "How many red shapes are there?" with a picture -> the call, the tool's result -> an answer
   with that number; and questions that need no tool (about the picture, or text) -> the usual
   answer.
The loss is on the assistant turns only. Writes to OUTDIR: tide-shapes.gguf and
tide-shapes-mmproj.gguf (with the new template), refs.json and vision_embd.bin (make_refs.py's,
for tests/model/ and tests/unit/), loss.csv and eval.json (PyTorch greedy accuracy on held-out
pictures, with and without the tool).
Usage: python3 finetune_tools.py OUTDIR [steps]   (run from scripts/train; PyTorch, a GPU or not)
Env: TRAIN_SECONDS (time cap of the training loop, default 150; the lr schedule follows it),
TRAIN_LR (peak, default 5e-4), TRAIN_BATCH (128), TRAIN_TOOL_FRAC (share of tool conversations,
0.55), TRAIN_SAMPLES (generated samples, reused in turn; default min(steps * batch, 160000)),
TRAIN_EVAL_N (held-out pictures per check, 128), TIDE_MODELS (folder of the GGUFs to start from).
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

import export_gguf
import gguf_read
import make_refs
import shapes as S
import train as T
from train_cfg import CFG, NP

LR = float(os.environ.get("TRAIN_LR", "5e-4"))
TOOL_FRAC = float(os.environ.get("TRAIN_TOOL_FRAC", "0.55"))
SEED0 = 2 * 10**6  # fine-tune data seeds (train.py used 1000..~10^6; the tests use >= 10^9)


def sample(seed):
    """-> (ids, loss mask over ids, image or None)."""
    rng = np.random.default_rng((seed, 7))  # not train.sample's stream: its first draw picks image or text
    if rng.random() >= TOOL_FRAC:
        ids, n_prompt, img, _ = T.sample(seed)
        return ids, [0] * n_prompt + [1] * (len(ids) - n_prompt), img
    msgs, tools, img, _ = S.tool_conversation(rng)
    ids, mask = S.conversation_ids(msgs, tools, NP)
    return ids, mask, img


def collate(items):
    """Pads to the batch's longest sample; the mask marks the tokens to predict."""
    L = max(len(x[0]) for x in items)
    ids = np.full((len(items), L), S.EOT, np.int64)
    lm = np.zeros((len(items), L), np.float32)
    imgs = []
    for i, (seq, mask, img) in enumerate(items):
        ids[i, :len(seq)] = seq
        lm[i, :len(seq)] = mask
        if img is not None:
            imgs.append(img)
    return (torch.from_numpy(ids).to(T.dev), torch.from_numpy(lm).to(T.dev),
            T.norm_img(np.stack(imgs)) if imgs else None)


def greedy_any(w, prompts, imgs, n):
    """train.greedy over prompts of different lengths (it takes one length at a time)."""
    out = [None] * len(prompts)
    for L in sorted({len(p) for p in prompts}):
        idx = [i for i, p in enumerate(prompts) if len(p) == L]
        got = T.greedy(w, [prompts[i] for i in idx], imgs[idx] if imgs is not None else None, n)
        for i, g in zip(idx, got):
            out[i] = g
    return out


def eval_tools(w, seed0, n):
    """With the tool offered (shapes.TOOL, as tests/model/test_model.py offers it): the colour
    question -> exactly the call; the call's result -> the answer with its number; "What is in
    this image?" (one shape) -> colour and shape named, no call."""
    rng = np.random.default_rng(seed0)
    res, call_p, trip_p, what_p, ims, cols, nums, objs1 = {}, [], [], [], [], [], [], []
    for _ in range(n):
        img, objs = S.make_image(rng)
        c = S.CNAMES[int(rng.integers(len(S.CNAMES)))]
        k = int(rng.integers(10))
        ims.append(img)
        cols.append(c)
        nums.append(k)
        user = {"role": "user", "content": S.IMAGE_MARK + S.Q_COLOUR_COUNT[0] % c}
        call = {"id": "call_0", "type": "function",
                "function": {"name": S.FN_NAME, "arguments": '{"colour":"%s"}' % c}}
        call_p.append(S.text_ids(S.render_chat([user], [S.TOOL]), NP))
        trip_p.append(S.text_ids(S.render_chat([user, {"role": "assistant", "content": None, "tool_calls": [call]},
                                                {"role": "tool", "tool_call_id": "call_0",
                                                 "content": json.dumps({"count": k})}], [S.TOOL]), NP))
    one = []
    for _ in range(n):
        img, objs = S.make_image(rng, 1)
        one.append(img)
        objs1.append(objs[0])
        what_p.append(S.text_ids(S.render_chat([{"role": "user", "content": S.IMAGE_MARK + S.Q_WHAT}], [S.TOOL]), NP))
    ims = T.norm_img(np.stack(ims))
    got = greedy_any(w, call_p, ims, 96)
    res["tool call"] = sum(g == S.tool_call_text(c) for g, c in zip(got, cols)) / n
    res["tool call sample"] = got[:3]
    got = greedy_any(w, trip_p, ims, 48)
    res["tool result answer"] = sum(str(k) in g for g, k in zip(got, nums)) / n
    res["tool result answer sample"] = got[:3]
    got = greedy_any(w, what_p, T.norm_img(np.stack(one)), 48)
    res["tools offered, what"] = sum(o[0] in g and o[1] in g and "<tool_call>" not in g for g, o in zip(got, objs1)) / n
    res["tools offered, what sample"] = got[:3]
    return res


def main():
    out = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    BS = int(os.environ.get("TRAIN_BATCH", "128"))
    cap = float(os.environ.get("TRAIN_SECONDS", "150"))
    n_data = min(steps * BS, int(os.environ.get("TRAIN_SAMPLES", "160000")))
    t0 = time.time()
    with mp.Pool(min(16, os.cpu_count() or 1)) as pool:  # numpy only, forked before the GPU is touched
        data = pool.map(sample, range(SEED0, SEED0 + n_data), chunksize=256)
    tgen = time.time() - t0
    print("data: %d samples in %.1f s, longest %d tokens" % (n_data, tgen, max(len(d[0]) for d in data)), flush=True)
    models = os.environ.get("TIDE_MODELS", os.path.join("..", "..", "models"))
    w0 = gguf_read.load_weights(os.path.join(models, "tide-shapes.gguf"), os.path.join(models, "tide-shapes-mmproj.gguf"))
    w = {k: torch.nn.Parameter(torch.from_numpy(v).to(T.dev), requires_grad=not k.startswith(("v.", "mm.")))
         for k, v in w0.items()}
    train_w = [p for p in w.values() if p.requires_grad]
    opt = torch.optim.AdamW(train_w, lr=LR, betas=(0.9, 0.98), weight_decay=0.01)
    log, skipped, t1, step = [], 0, time.time(), 0
    for step in range(steps):
        prog = min(1.0, max(step / steps, (time.time() - t1) / max(1.0, cap)))
        lr = LR * min(1.0, (step + 1) / 50) * (0.5 * (1 + math.cos(math.pi * prog)) * 0.95 + 0.05)
        for gp in opt.param_groups:
            gp["lr"] = lr
        o = (step * BS) % max(1, n_data - BS + 1)
        ids, lm, im = collate(data[o:o + BS])
        T.decoder.aux = 0.0
        with T.autocast():
            logits = T.forward(w, ids[:, :-1], im)
        ce = F.cross_entropy(logits.float().reshape(-1, S.N_VOCAB), ids[:, 1:].reshape(-1), reduction="none",
                             ignore_index=S.IMG)
        loss = (ce * lm[:, 1:].reshape(-1)).sum() / lm[:, 1:].sum()
        total = loss + 0.01 * T.decoder.aux
        if not torch.isfinite(total):  # a bad step is skipped, never applied
            skipped += 1
            opt.zero_grad(set_to_none=True)
            continue
        total.backward()
        torch.nn.utils.clip_grad_norm_(train_w, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        last = prog >= 1.0 or step == steps - 1
        if step % 25 == 0 or last:
            log.append((step, loss.item()))
            print("step %d loss %.4f lr %.2e %.1fs" % (step, loss.item(), lr, time.time() - t0), flush=True)
        if last:
            break
    ttrain = time.time() - t1
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():  # matrices as the GGUF stores them (f16); vectors and the router stay f32
        for k, v in w.items():
            if v.dim() >= 2 and "ffn_gate_inp" not in k:
                v.copy_(v.half().float())
    wn = {k: v.detach().cpu().numpy() for k, v in w.items()}
    export_gguf.export(wn, os.path.join(out, "tide-shapes.gguf"), os.path.join(out, "tide-shapes-mmproj.gguf"))
    make_refs.write(T.reference_vectors(w), os.path.join(out, "refs.json"))
    with open(os.path.join(out, "loss.csv"), "w") as f:
        f.write("step,loss\n" + "".join("%d,%.5f\n" % s for s in log))
    n_eval = int(os.environ.get("TRAIN_EVAL_N", "128"))
    ev = T.evaluate(w, 10**9 + 7, n_eval)
    ev.update(eval_tools(w, 10**9 + 11, n_eval))
    ev.update(train_s=ttrain, datagen_s=tgen, steps=step + 1, batch=BS, skipped=skipped, samples=n_data,
              lr=LR, tool_frac=TOOL_FRAC, cfg=CFG, total_s=time.time() - t0)
    print(json.dumps(ev, indent=1), flush=True)
    with open(os.path.join(out, "eval.json"), "w") as f:
        json.dump(ev, f, indent=1)


if __name__ == "__main__":
    main()
