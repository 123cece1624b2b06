"""export_gguf.py - writes train.py's weights.npz as tide's two GGUF files (numpy only).

models/tide-shapes.gguf: the `llama` MoE text model with its byte-level tokenizer (256 byte
tokens in GPT-2's alphabet, no merges, ChatML specials) and chat template (shapes.CHAT_TEMPLATE:
ChatML, plus tools and tool calls in the hermes <tool_call> format);
models/tide-shapes-mmproj.gguf: the `clip` vision tower with the `mlp` projector (the keys
src/vision/clip.c reads, docs/VISION.md). Matrices f16, vectors and the router f32.
A small GGUF v3 writer of our own. Usage: export_gguf.py weights.npz TEXT.gguf MMPROJ.gguf
"""
import struct
import sys

import numpy as np

import shapes as S
import train_cfg as C

U32, I32, F32, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, t, v):
    out = gstr(key) + struct.pack("<I", t)
    if t == U32: return out + struct.pack("<I", v)
    if t == F32: return out + struct.pack("<f", v)
    if t == BOOL: return out + struct.pack("<B", 1 if v else 0)
    if t == STR: return out + gstr(v)
    et, vals = v
    out += struct.pack("<IQ", et, len(vals))
    if et == STR: return out + b"".join(gstr(x) for x in vals)
    return out + np.asarray(vals, {I32: "<i4", F32: "<f4"}[et]).tobytes()


def write(path, kvs, tensors):
    """tensors: [(name, numpy array in C order, f16?)]; ggml's ne is the reversed shape."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kv(*x) for x in kvs)
    infos, blobs, off = b"", [], 0
    for name, a, half in tensors:
        d = np.ascontiguousarray(a, np.float16 if half else np.float32).tobytes()
        infos += gstr(name) + struct.pack("<I", a.ndim) + b"".join(struct.pack("<Q", n) for n in a.shape[::-1])
        infos += struct.pack("<IQ", 1 if half else 0, off)
        pad = (-len(d)) % 32
        blobs.append(d + b"\0" * pad)
        off += len(d) + pad
    body = head + infos
    body += b"\0" * ((-len(body)) % 32)
    with open(path, "wb") as f:
        f.write(body)
        for b in blobs:
            f.write(b)


def byte_cp():
    """GPT-2's byte -> printable code point map."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, cs))


def export(w, text_path, mmproj_path, template=S.CHAT_TEMPLATE):
    """w: train.py's weights (name -> array, f16-rounded matrices) -> the two GGUF files."""
    m = byte_cp()
    toks = [chr(m[b]) for b in range(256)] + S.SPECIALS
    a = "llama."
    kvs = [("general.architecture", STR, "llama"), ("general.name", STR, "tide-shapes"),
           ("general.license", STR, "tide (ours)"),
           (a + "context_length", U32, 4096), (a + "embedding_length", U32, C.E),
           (a + "block_count", U32, C.NL), (a + "feed_forward_length", U32, C.FF),
           (a + "attention.head_count", U32, C.NH), (a + "attention.head_count_kv", U32, C.NKV),
           (a + "attention.key_length", U32, C.HD), (a + "attention.value_length", U32, C.HD),
           (a + "rope.freq_base", F32, 10000.0), (a + "rope.dimension_count", U32, C.HD),
           (a + "attention.layer_norm_rms_epsilon", F32, 1e-5), (a + "vocab_size", U32, S.N_VOCAB),
           (a + "expert_count", U32, C.NX), (a + "expert_used_count", U32, C.NUSED),
           (a + "expert_feed_forward_length", U32, C.FF),
           ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "gpt-2"),
           ("tokenizer.ggml.tokens", ARR, (STR, toks)),
           ("tokenizer.ggml.token_type", ARR, (I32, [1] * 256 + [3] * len(S.SPECIALS))),
           ("tokenizer.ggml.merges", ARR, (STR, [])),
           ("tokenizer.ggml.bos_token_id", U32, S.EOT), ("tokenizer.ggml.eos_token_id", U32, S.IM_END),
           ("tokenizer.ggml.padding_token_id", U32, S.EOT), ("tokenizer.ggml.add_bos_token", BOOL, False),
           ("tokenizer.chat_template", STR, template)]
    text = [(k, v, v.ndim >= 2 and "ffn_gate_inp" not in k) for k, v in w.items() if not k.startswith(("v.", "mm."))]
    write(text_path, kvs, text)
    kvs = [("general.architecture", STR, "clip"), ("general.name", STR, "tide-shapes-mmproj"),
           ("general.license", STR, "tide (ours)"), ("general.file_type", U32, 1),
           ("clip.has_text_encoder", BOOL, False), ("clip.has_vision_encoder", BOOL, True),
           ("clip.has_llava_projector", BOOL, True), ("clip.projector_type", STR, "mlp"),
           ("clip.use_gelu", BOOL, True), ("clip.vision.image_size", U32, S.SIZE),
           ("clip.vision.patch_size", U32, C.P), ("clip.vision.embedding_length", U32, C.VD),
           ("clip.vision.feed_forward_length", U32, C.VF), ("clip.vision.projection_dim", U32, C.E),
           ("clip.vision.block_count", U32, C.VL), ("clip.vision.attention.head_count", U32, C.VH),
           ("clip.vision.attention.layer_norm_epsilon", F32, 1e-5),
           ("clip.vision.feature_layer", ARR, (I32, [C.VL])),
           ("clip.vision.image_mean", ARR, (F32, [0.48145466, 0.4578275, 0.40821073])),
           ("clip.vision.image_std", ARR, (F32, [0.26862954, 0.26130258, 0.27577711]))]
    vis = [(k, v, v.ndim >= 2) for k, v in w.items() if k.startswith(("v.", "mm."))]
    write(mmproj_path, kvs, vis)


if __name__ == "__main__":
    export(dict(np.load(sys.argv[1])), sys.argv[2], sys.argv[3])
