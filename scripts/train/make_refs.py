"""make_refs.py - turns train.py's refs.npz into tests/model/refs.json (numpy only).

For each reference prompt (a text one, one with the reference image) it keeps the question,
the image's pixels and PyTorch's top-10 next-token logprobs (log-softmax of the exported
logits, computed with the f16-rounded weights the GGUF holds). tests/model/test_model.py
checks tide's reported logprobs against them. Usage: make_refs.py refs.npz OUT.json
"""
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
    r = np.load(sys.argv[1])
    out = [{"question": "What is 3 + 4?", "image": None, "top": top5(r["text_logits"])},
           {"question": S.Q_WHAT, "image": r["image"].tolist(), "top": top5(r["image_logits"])}]
    json.dump(out, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
