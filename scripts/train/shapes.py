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


# --- tool calls (issue 23): one function, get_shape_count(colour) ---------------------------
# The chat template the GGUF carries (export_gguf.py writes it; tide renders it with its Jinja
# interpreter, docs/TEMPLATES.md). Without tools and tool turns it renders exactly the ChatML of
# the earlier runs. With tools: a system turn listing each function's JSON (tojson: keys in
# the order sent, ", " and ": "), a user system message merged into it; an assistant turn's
# calls as <tool_call>\n{"name":NAME,"arguments":ARGS}\n</tool_call> (ARGS the string as the
# client sends it back, i.e. the compact JSON tide returned); a tool result as a `tool` turn.
# render_chat() below writes the same text in Python; tests/model/test_model.py compares the
# two through build/tide-jinja.
TOOLS_HEAD = "You can call these functions:\n"
TOOLS_TAIL = 'To call one, reply <tool_call>\n{"name":NAME,"arguments":{...}}\n</tool_call>'
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '" + TOOLS_HEAD.replace("\n", "\\n") + "' }}"
    "{% for tool in tools %}{{ tool['function'] | tojson + '\\n' }}{% endfor %}"
    "{{ '" + TOOLS_TAIL.replace("\n", "\\n") + "<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if loop.first and tools and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{% if message['content'] %}{{ message['content'] + '\\n' }}{% endif %}"
    "{% for tc in message['tool_calls'] %}"
    "{{ '<tool_call>\\n{\"name\":' + tc['function']['name'] | tojson + ',\"arguments\":' }}"
    "{% if tc['function']['arguments'] is string %}{{ tc['function']['arguments'] }}"
    "{% else %}{{ tc['function']['arguments'] | tojson }}{% endif %}"
    "{{ '}\\n</tool_call>' }}{% if not loop.last %}{{ '\\n' }}{% endif %}"
    "{% endfor %}{{ '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
IMAGE_MARK = "\x01tide:image\x01"  # where tide puts an image part in the message text
FN_NAME = "get_shape_count"
# the tool as tests/model/test_model.py offers it; training also shows the variants below
TOOL = {"type": "function", "function": {
    "name": FN_NAME, "description": "Count the shapes of one colour in the picture.",
    "parameters": {"type": "object", "properties": {"colour": {"type": "string", "enum": CNAMES}},
                   "required": ["colour"]}}}
TOOL_VARIANTS = [
    TOOL,
    {"type": "function", "function": {
        "name": FN_NAME, "parameters": {"type": "object", "properties": {"colour": {"type": "string"}},
                                        "required": ["colour"]}}},
    {"type": "function", "function": {
        "name": FN_NAME, "description": "How many shapes of a colour the image has.",
        "parameters": {"type": "object", "properties": {"colour": {
            "type": "string", "description": "a colour name, e.g. red"}}, "required": ["colour"]}}},
]
Q_COLOUR_COUNT = ["How many %s shapes are there?", "How many %s shapes are in the picture?",
                  "Count the %s shapes."]


def tool_call_text(colour):
    """The assistant's call as the model writes it (and the template renders it back)."""
    return '<tool_call>\n{"name":"%s","arguments":{"colour":"%s"}}\n</tool_call>' % (FN_NAME, colour)


def colour_count_answer(colour, n):
    return "There %s %d %s shape%s." % ("is" if n == 1 else "are", n, colour, "" if n == 1 else "s")


def render_chat(messages, tools=None, add_generation_prompt=True):
    """CHAT_TEMPLATE in Python: messages as tide passes them to the template (content a string
    with IMAGE_MARK for each image, None for an assistant turn that only calls)."""
    import json
    out = ""
    if tools:
        out += "<|im_start|>system\n"
        if messages[0]["role"] == "system":
            out += messages[0]["content"] + "\n\n"
        out += TOOLS_HEAD + "".join(json.dumps(t["function"], ensure_ascii=False) + "\n" for t in tools)
        out += TOOLS_TAIL + "<|im_end|>\n"
    for i, m in enumerate(messages):
        if i == 0 and tools and m["role"] == "system":
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            out += "<|im_start|>assistant\n" + (m["content"] + "\n" if m.get("content") else "")
            calls = []
            for tc in m["tool_calls"]:
                a = tc["function"]["arguments"]
                calls.append('<tool_call>\n{"name":' + json.dumps(tc["function"]["name"], ensure_ascii=False) +
                             ',"arguments":' + (a if isinstance(a, str) else json.dumps(a, ensure_ascii=False)) +
                             "}\n</tool_call>")
            out += "\n".join(calls) + "<|im_end|>\n"
        else:
            out += "<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n"
    if add_generation_prompt:
        out += "<|im_start|>assistant\n"
    return out


def text_ids(text, n_img_tokens):
    """Rendered chat text -> token ids as tide's tokenizer makes them (bytes, the specials, and
    <|vision_start|> IMG*n <|vision_end|> for each IMAGE_MARK)."""
    ids, i = [], 0
    while i < len(text):
        if text.startswith(IMAGE_MARK, i):
            ids += [V_START] + [IMG] * n_img_tokens + [V_END]
            i += len(IMAGE_MARK)
            continue
        for k, sp in enumerate(SPECIALS):
            if text.startswith(sp, i):
                ids.append(256 + k)
                i += len(sp)
                break
        else:
            j = i + 1
            while j < len(text) and text[j] not in "<\x01":
                j += 1
            ids += enc(text[i:j])
            i = j
    return ids


def tool_conversation(rng):
    """A conversation with the tool offered: -> (messages, tools, [assistant replies to learn]).
    Each reply is the text the model writes for the assistant turn at that point (with the
    turns before it as the prompt)."""
    tools = [TOOL_VARIANTS[int(rng.integers(len(TOOL_VARIANTS)))]]
    msgs = [{"role": "system", "content": "You are a helpful assistant."}] if rng.random() < 0.1 else []
    k = rng.random()
    if k < 0.6:  # the colour count: a call, the tool's result, the answer with that number
        img, objs = make_image(rng)
        colour = CNAMES[int(rng.integers(len(CNAMES)))]
        if rng.random() < 0.3:  # a colour that is in the picture, as users tend to ask
            colour = objs[int(rng.integers(len(objs)))][0]
        q = Q_COLOUR_COUNT[int(rng.integers(len(Q_COLOUR_COUNT)))] % colour
        n = sum(c == colour for c, _ in objs) if rng.random() < 0.5 else int(rng.integers(10))
        r = int(rng.integers(3))
        result = str(n) if r == 0 else '{"count": %d}' % n if r == 1 else '{"colour": "%s", "count": %d}' % (colour, n)
        msgs.append({"role": "user", "content": IMAGE_MARK + q})
        call = {"id": "call_1", "type": "function",
                "function": {"name": FN_NAME, "arguments": '{"colour":"%s"}' % colour}}
        replies = [tool_call_text(colour), colour_count_answer(colour, n)]
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call_1", "content": result},
                 {"role": "assistant", "content": replies[1]}]
        return msgs, tools, img, replies
    if k < 0.85:  # a question about the picture that needs no tool
        img, objs = make_image(rng)
        q, a = image_qa(rng, objs)
        msgs += [{"role": "user", "content": IMAGE_MARK + q}, {"role": "assistant", "content": a}]
        return msgs, tools, img, [a]
    q, a = text_chat(rng)
    msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs, tools, None, [a]


def conversation_ids(msgs, tools, n_img_tokens):
    """-> (ids, loss mask): the whole conversation, the mask on each assistant reply (and its
    <|im_end|>). Each assistant turn's prompt is the render of the turns before it, so what the
    model learns to write is what tide's template renders back in the next request."""
    ids, mask = [], []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prompt = text_ids(render_chat(msgs[:i], tools, True), n_img_tokens)
        full = text_ids(render_chat(msgs[:i + 1], tools, False), n_img_tokens)
        assert prompt == full[:len(prompt)] and full[:len(ids)] == ids, "template is not a prefix"
        mask += [0] * (len(prompt) - len(ids)) + [1] * (len(full) - len(prompt) - 1)
        ids = full[:-1]  # the trailing "\n" after <|im_end|> is the next prompt's
        assert ids[-1] == IM_END
    return ids, mask


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
