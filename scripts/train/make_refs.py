"""make_refs.py - turns train.py's refs.npz into tests/model/refs.json (numpy only).

For each reference prompt (a text one, one with the reference image) it keeps the question,
the image's pixels and PyTorch's top-10 next-token logprobs (log-softmax of the exported
logits, computed with the f16-rounded weights the GGUF holds). tests/model/test_model.py
checks tide's reported logprobs against them. It also writes OUT.json's sibling
vision_embd.bin for tests/unit/test_model_refs.c: int32 w, h; the image's (h, w, 3) bytes;
int32 n_tokens, n_embd; PyTorch's (n_tokens, n_embd) f32 image embeddings, little-endian.
Usage: make_refs.py refs.npz OUT.json
"""
import os
import struct
import json
import sys

import numpy as np

import shapes as S


def tok_bytes(i):
    return list(S.SPECIALS[i - 256].encode()) if i >= 256 else [i]


def top5(logits):
    lp = logits.astype(np.float64)
    lp = lp - lp.max()
    lp = lp - np.log(np.exp(lp).sum())
    return [[tok_bytes(int(i)), float(lp[i])] for i in np.argsort(-lp)[:10]]


def main():
    write(np.load(sys.argv[1]), sys.argv[2])


def write(r, out_json):
    """r: refs.npz's arrays (a mapping) -> out_json and vision_embd.bin beside it."""
    out = [{"question": "What is 3 + 4?", "image": None, "top": top5(r["text_logits"])},
           {"question": S.Q_WHAT, "image": r["image"].tolist(), "top": top5(r["image_logits"])}]
    json.dump(out, open(out_json, "w"))
    img, emb = r["image"].astype(np.uint8), r["image_embd"].astype("<f4")
    with open(os.path.join(os.path.dirname(out_json) or ".", "vision_embd.bin"), "wb") as f:
        f.write(struct.pack("<ii", img.shape[1], img.shape[0]) + img.tobytes() +
                struct.pack("<ii", *emb.shape) + emb.tobytes())


if __name__ == "__main__":
    main()
