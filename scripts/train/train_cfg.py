"""train_cfg.py - the shapes of tide's tiny model, shared by train.py and export_gguf.py."""
E, NL, NH, NKV, HD, FF, NX, NUSED = 128, 4, 4, 2, 32, 256, 8, 2  # text decoder
VD, VF, VH, VL, P = 128, 256, 4, 3, 8  # vision tower: width, ffn, heads, blocks, patch
NP = (64 // P) ** 2  # image tokens
