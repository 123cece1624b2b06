"""gguf_read.py - reads tide's own GGUF files back into train.py's weights (numpy only).

The reverse of export_gguf.py: a GGUF v3 file's key/values and its f32/f16 tensors, each as a
float32 array in PyTorch's shape (ggml's ne reversed). load_weights() joins the text model and
the mmproj into the dict train.py builds (less its training-only probes), so a run can start
from the shipped model (finetune_tools.py). Other tensor types (quantised) are refused.
Usage as a check: gguf_read.py FILE.gguf   (prints the keys and tensors)
"""
import struct
import sys

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
STR, ARR = 8, 9


class _Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.d, self.p)[0]
        self.p += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.d[self.p:self.p + n].decode("utf-8")
        self.p += n
        return s

    def value(self, t):
        if t == STR:
            return self.string()
        if t == ARR:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        v = self.take(_SCALAR[t])
        return bool(v) if t == 7 else v


def read(path):
    """-> (key/values dict, {name: float32 array in PyTorch's shape}), tensors in file order."""
    data = open(path, "rb").read()
    r = _Reader(data)
    if data[:4] != b"GGUF":
        raise ValueError("%s: not a GGUF file" % path)
    r.p = 4
    version, n_t, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    if version != 3:
        raise ValueError("%s: GGUF version %d (3 expected)" % (path, version))
    kvs = {}
    for _ in range(n_kv):
        k = r.string()
        kvs[k] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_t):
        name = r.string()
        ne = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, ne, r.take("<I"), r.take("<Q")))
    align = kvs.get("general.alignment", 32)
    base = (r.p + align - 1) // align * align
    tensors = {}
    for name, ne, typ, off in infos:
        if typ not in (0, 1):
            raise ValueError("%s: tensor %s has type %d (only f32 and f16 are read)" % (path, name, typ))
        n = int(np.prod(ne))
        a = np.frombuffer(data, np.float32 if typ == 0 else np.float16, n, base + off)
        tensors[name] = a.astype(np.float32).reshape(ne[::-1])
    return kvs, tensors


def load_weights(text_path, mmproj_path):
    """The shipped model's weights as train.py names them (text tensors, then v.* and mm.*)."""
    w = dict(read(text_path)[1])
    w.update(read(mmproj_path)[1])
    return w


if __name__ == "__main__":
    kv, t = read(sys.argv[1])
    for k, v in kv.items():
        print(k, "=", (v if not isinstance(v, list) or len(v) < 8 else "[%d items]" % len(v)))
    for k, v in t.items():
        print(k, v.shape)
