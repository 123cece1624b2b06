"""train_cfg.py - the shapes of tide's tiny model, shared by train.py and export_gguf.py.

TIDE_MODEL_CFG="P=4,VL=4" overrides any of the names below (for trying variants; train.py
writes the values it used to OUTDIR/cfg.json, and export_gguf.py must see the same ones).
"""
import os

E, NL, NH, NKV, HD, FF, NX, NUSED = 128, 4, 4, 2, 32, 256, 8, 2  # text decoder
VD, VF, VH, VL, P = 128, 256, 4, 4, 8  # vision tower: width, ffn, heads, blocks, patch
for _kv in filter(None, os.environ.get("TIDE_MODEL_CFG", "").split(",")):
    _k, _v = _kv.split("=")
    assert _k in ("E", "NL", "NH", "NKV", "HD", "FF", "NX", "NUSED", "VD", "VF", "VH", "VL", "P"), _k
    globals()[_k] = int(_v)
NP = (64 // P) ** 2  # image tokens
CFG = dict(E=E, NL=NL, NH=NH, NKV=NKV, HD=HD, FF=FF, NX=NX, NUSED=NUSED, VD=VD, VF=VF, VH=VH, VL=VL, P=P)
