"""shapes.py - the synthetic data of tide's own tiny vision-language model.

Images: 64x64 RGB, 1-3 coloured shapes (6 shapes, 8 colours) of random size and position
on a random grey-ish background, with pixel noise. Questions and answers about them, and
text-only chat (greetings, facts about the shapes, single-digit arithmetic). Numpy only:
the training script (scripts/train/train.py) and the accuracy test
(tests/model/accuracy.py) both draw from here, with disjoint seeds.
Tokens are bytes (ids 0-255, GPT-2's byte-level alphabet, no merges) plus the specials.
"""
import numpy as np

SIZE = 64
SHAPES = ["square", "circle", "triangle", "diamond", "cross", "ring"]
COLOURS = {
    "red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220),
    "yellow": (240, 225, 30), "orange": (250, 140, 20), "purple": (140, 40, 190),
    "white": (250, 250, 250), "black": (10, 10, 10),
}
CNAMES = list(COLOURS)
NUM = ["zero", "one", "two", "three"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>"]
EOT, IM_START, IM_END, V_START, V_END = range(256, 261)
N_VOCAB = 261
IMG = -1  # placeholder id for an image-embedding position

Q_WHAT = "What is in this image?"
Q_COLOUR = "What colour is the shape?"
Q_SHAPE = "What shape is it?"
Q_COUNT = "How many shapes are there?"

_yy, _xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) + 0.5


def _mask(shape, cx, cy, r):
    dx, dy = _xx - cx, _yy - cy
    if shape == "square":
        return (np.abs(dx) <= r) & (np.abs(dy) <= r)
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "triangle":
        return (dy >= -r) & (dy <= r) & (np.abs(dx) <= (dy + r) * 0.6)
    if shape == "diamond":
        return np.abs(dx) + np.abs(dy) <= r * 1.2
    if shape == "cross":
        t = r / 3.0
        return ((np.abs(dx) <= t) & (np.abs(dy) <= r)) | ((np.abs(dy) <= t) & (np.abs(dx) <= r))
    d2 = dx * dx + dy * dy
    return (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)


def make_image(rng, n=None):
    """-> (uint8 HxWx3, [(colour, shape), ...])"""
    if n is None:
        n = int(rng.integers(1, 4))
    bg = rng.integers(70, 180) + rng.integers(-15, 16, size=3)
    img = np.empty((SIZE, SIZE, 3), np.float32)
    img[:] = bg
    objs, placed = [], []
    while len(objs) < n:
        r = float(rng.uniform(7, 15) if n == 1 else rng.uniform(5, 9))
        cx, cy = rng.uniform(r + 1, SIZE - r - 1, size=2)
        if any((cx - px) ** 2 + (cy - py) ** 2 < (r + pr + 3) ** 2 for px, py, pr in placed):
            continue
        placed.append((cx, cy, r))
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        cname = CNAMES[int(rng.integers(len(CNAMES)))]
        col = np.array(COLOURS[cname], np.float32) + rng.integers(-20, 21, size=3)
        img[_mask(shape, cx, cy, r)] = col
        objs.append((cname, shape))
    img += rng.normal(0, 8, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8), objs


def what_answer(objs):
    if len(objs) == 1:
        return "A %s %s." % objs[0]
    parts = ["a %s %s" % o for o in objs]
    return "%s shapes: %s." % (NUM[len(objs)].capitalize(), ", ".join(parts[:-1]) + " and " + parts[-1])


def image_qa(rng, objs):
    """One question about an image and its answer."""
    k = int(rng.integers(4))
    if len(objs) > 1 and k in (1, 2):
        k = 0 if rng.random() < 0.5 else 3
    if k == 0:
        return Q_WHAT, what_answer(objs)
    if k == 1:
        return Q_COLOUR, "It is %s." % objs[0][0]
    if k == 2:
        return Q_SHAPE, "It is a %s." % objs[0][1]
    n = len(objs)
    return Q_COUNT, "There %s %s shape%s." % ("is" if n == 1 else "are", NUM[n], "" if n == 1 else "s")


SIDES = {"square": "four", "triangle": "three", "diamond": "four"}
GREET = [("Hello", "Hello! Show me a picture of shapes and I will tell you what is in it."),
         ("Hi", "Hi! Show me a picture of shapes and I will tell you what is in it."),
         ("Hello!", "Hello! Show me a picture of shapes and I will tell you what is in it."),
         ("Who are you?", "I am tide's tiny model. I know about shapes, colours and small sums."),
         ("What can you do?", "I can name the shapes and colours in a picture, count them, and add small numbers."),
         ("Thank you", "You are welcome."),
         ("What shapes do you know?", "I know squares, circles, triangles, diamonds, crosses and rings."),
         ("What colours do you know?", "I know red, green, blue, yellow, orange, purple, white and black.")]


def text_chat(rng):
    k = int(rng.integers(4))
    if k == 0:
        return GREET[int(rng.integers(len(GREET)))]
    if k == 1:
        s = ["square", "triangle", "diamond"][int(rng.integers(3))]
        return ("How many sides does a %s have?" % s, "A %s has %s sides." % (s, SIDES[s]))
    a, b = int(rng.integers(10)), int(rng.integers(10))
    if k == 2:
        return ("What is %d + %d?" % (a, b), "%d + %d = %d." % (a, b, a + b))
    a, b = max(a, b), min(a, b)
    return ("What is %d - %d?" % (a, b), "%d - %d = %d." % (a, b, a - b))


def enc(s):
    return list(s.encode("utf-8"))


def prompt_ids(question, with_image, n_img_tokens):
    """ChatML prompt, as tide's template renders it (image part first, then the text)."""
    ids = [IM_START] + enc("user\n")
    if with_image:
        ids += [V_START] + [IMG] * n_img_tokens + [V_END]
    ids += enc(question) + [IM_END] + enc("\n") + [IM_START] + enc("assistant\n")
    return ids


def answer_ids(answer):
    return enc(answer) + [IM_END]


def png_bytes(img):
    """A minimal PNG encoder (RGB, 8 bit) for the tests and the README's picture."""
    import struct
    import zlib
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(t, d):
        c = struct.pack(">I", len(d)) + t + d
        return c + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
