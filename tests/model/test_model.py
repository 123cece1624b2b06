#!/usr/bin/python3
"""test_model.py - tide's own trained model (models/tide-shapes*.gguf) through the HTTP API on CPU.

Starts $TIDE_BIN on a free loopback port with the shipped model and its mmproj, then:
 1. parity: the top-5 logprobs tide reports for the reference prompts (one text, one with the
    reference image) match PyTorch's top-10 (tests/model/refs.json, from scripts/train/make_refs.py)
    to a relative error < 1e-3;
 2. accuracy: N held-out images (seeds from 10^9, training used 1000..~10^6), drawn by
    scripts/train/shapes.py, asked "What is in this image?" (one shape: the answer must name
    its colour and shape, >= 95%) and "How many shapes are there?" (1-3 shapes, >= 90%);
 3. text: a fixed list of prompts; the arithmetic ones must give the right sum;
 4. the README's request: models/red-square.png, "What is in this image?", default sampling
    (temperature 0, as the README's curl sends it), must answer a red square;
 5. tool calls (issue 23): the GGUF's chat template is scripts/train/shapes.py's CHAT_TEMPLATE,
    and tide renders it (build/tide-jinja, and prompt_tokens through the API) as the training
    data was rendered; with get_shape_count offered, "How many COLOUR shapes are there?" about
    N/2 held-out pictures must give message.tool_calls = one get_shape_count call with
    arguments {"colour": COLOUR} (>= 90%), and the round trip (that reply, then a tool message
    {"count": K}, K random 0-9) an answer with K in it and no call (>= 90%); tool_choice
    "required" (constrained decoding) on N/10 of them must name the asked colour (>= 90%).
Prints the measured accuracies. Usage: tests/model/test_model.py [N]   (env: TIDE_BIN)
Run by `make test` (N = 200); tests/unit/test_model_refs.c checks the vision embeddings.
"""
import base64
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts", "train"))
import numpy as np  # noqa: E402
import gguf_read  # noqa: E402
import shapes as S  # noqa: E402
from train_cfg import NP  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
fails = []


def post(port, path, body):
    r = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as f:
        return json.loads(f.read())


def ask(port, question, img=None):
    content = question
    if img is not None:
        url = "data:image/png;base64," + base64.b64encode(S.png_bytes(img)).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
    r = post(port, "/v1/chat/completions", {"model": "tide", "temperature": 0, "max_tokens": 64,
                                            "messages": [{"role": "user", "content": content}]})
    return r["choices"][0]["message"]["content"]


def image_content(img, question):
    url = "data:image/png;base64," + base64.b64encode(S.png_bytes(img)).decode()
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]


def template(tide_jinja):
    """The GGUF carries the template the training data was rendered with, and tide renders it
    as shapes.render_chat does (the round trip's messages, as the API passes them on)."""
    kv, _ = gguf_read.read(os.path.join(ROOT, "models", "tide-shapes.gguf"))
    if kv.get("tokenizer.chat_template") != S.CHAT_TEMPLATE:
        fails.append("template: models/tide-shapes.gguf's chat template is not shapes.CHAT_TEMPLATE "
                     "(the model was not exported by scripts/train/export_gguf.py of this tree)")
    user = {"role": "user", "content": S.IMAGE_MARK + S.Q_COLOUR_COUNT[0] % "red"}
    call = {"id": "call_x", "type": "function", "function": {"name": S.FN_NAME, "arguments": '{"colour":"red"}'}}
    chats = [([user], [S.TOOL]), ([{"role": "system", "content": "Be brief."}, user], [S.TOOL]),
             ([user, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_x", "content": '{"count": 3}'}], [S.TOOL]),
             ([{"role": "user", "content": "Hello"}], None)]
    with tempfile.TemporaryDirectory() as d:
        tp = os.path.join(d, "t.jinja")
        open(tp, "w").write(S.CHAT_TEMPLATE)
        for i, (msgs, tools) in enumerate(chats):
            ctx = {"messages": msgs, "add_generation_prompt": True, "bos_token": "<|endoftext|>",
                   "eos_token": "<|im_end|>"}
            if tools:
                ctx["tools"] = tools
            dp = os.path.join(d, "c%d.json" % i)
            json.dump(ctx, open(dp, "w"))
            r = subprocess.run([tide_jinja, tp, dp], capture_output=True)
            want = S.render_chat(msgs, tools)
            if r.returncode or r.stdout.decode() != want:
                fails.append("template: tide-jinja renders chat %d as %r, the training data as %r" %
                             (i, r.stdout.decode()[-120:], want[-120:]))
    print("template: chat template checked (%d chats through tide-jinja)" % len(chats))


def tool_request(port, messages, choice="auto"):
    return post(port, "/v1/chat/completions", {"model": "tide", "temperature": 0, "max_tokens": 96,
                                               "messages": messages, "tools": [S.TOOL], "tool_choice": choice})


def tools(port):
    n = max(1, N // 2)
    rng = np.random.default_rng(10**9 + 4242)
    ok_call = ok_trip = ok_req = n_req = 0
    for i in range(n):
        img, objs = S.make_image(rng)
        colour = S.CNAMES[int(rng.integers(len(S.CNAMES)))]
        k = int(rng.integers(10))
        user = {"role": "user", "content": image_content(img, S.Q_COLOUR_COUNT[0] % colour)}
        r = tool_request(port, [user])
        if i == 0:  # the prompt tide built is the one the training data had
            want = len(S.text_ids(S.render_chat([{"role": "user", "content": S.IMAGE_MARK + S.Q_COLOUR_COUNT[0] % colour}],
                                                [S.TOOL]), NP))
            if r["usage"]["prompt_tokens"] != want:
                fails.append("tools: prompt_tokens %d, the training data's render has %d" % (r["usage"]["prompt_tokens"], want))
        ch = r["choices"][0]
        calls = ch["message"].get("tool_calls") or []
        good = (ch["finish_reason"] == "tool_calls" and len(calls) == 1 and calls[0]["function"]["name"] == S.FN_NAME
                and json.loads(calls[0]["function"]["arguments"]) == {"colour": colour})
        ok_call += good
        if not good and i + 1 - ok_call <= 3:
            print("  miss: tool call for %r -> %r" % (colour, ch["message"]))
        # the round trip: the reply as it came back (or, when it was no call, the call it should have been)
        reply = ch["message"] if good else {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": S.FN_NAME, "arguments": '{"colour":"%s"}' % colour}}]}
        call_id = reply["tool_calls"][0]["id"]
        r = tool_request(port, [user, reply, {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"count": k})}])
        ch = r["choices"][0]
        a = ch["message"].get("content") or ""
        good = str(k) in a and not ch["message"].get("tool_calls") and ch["finish_reason"] == "stop"
        ok_trip += good
        if not good and i + 1 - ok_trip <= 3:
            print("  miss: %r with count %d -> %r" % (colour, k, ch["message"]))
        if i % 10 == 0:  # forced: constrained decoding makes it a call; the model picks the colour
            n_req += 1
            r = tool_request(port, [user], "required")
            calls = r["choices"][0]["message"].get("tool_calls") or []
            ok_req += len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]).get("colour") == colour
    pc, pt, pr = ok_call / n, ok_trip / n, ok_req / n_req
    print("tools: 'How many COLOUR shapes are there?' with get_shape_count offered: the call %d/%d = %.1f%%" % (ok_call, n, 100 * pc))
    print("tools: the round trip with the tool's count: the number in the answer %d/%d = %.1f%%" % (ok_trip, n, 100 * pt))
    print("tools: tool_choice required: the asked colour %d/%d = %.1f%%" % (ok_req, n_req, 100 * pr))
    if pc < 0.90:
        fails.append("tool call accuracy %.3f < 0.90" % pc)
    if pt < 0.90:
        fails.append("tool round trip accuracy %.3f < 0.90" % pt)
    if pr < 0.90:
        fails.append("tool_choice required colour accuracy %.3f < 0.90" % pr)


def parity(port):
    refs = json.load(open(os.path.join(ROOT, "tests", "model", "refs.json")))
    worst = 0.0
    for ref in refs:
        img = np.array(ref["image"], np.uint8) if ref.get("image") else None
        q = ref["question"]
        content = q
        if img is not None:
            url = "data:image/png;base64," + base64.b64encode(S.png_bytes(img)).decode()
            content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": q}]
        r = post(port, "/v1/chat/completions", {"model": "tide", "temperature": 0, "max_tokens": 1,
                                                "logprobs": True, "top_logprobs": 5,
                                                "messages": [{"role": "user", "content": content}]})
        top = r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        want = {tuple(b): lp for b, lp in ref["top"]}
        for t in top:
            b = tuple(t["bytes"])
            if b not in want:
                fails.append("parity %r: tide's top-5 token %r is not in PyTorch's top-10" % (q, t["token"]))
                continue
            worst = max(worst, abs(t["logprob"] - want[b]) / max(abs(want[b]), 1e-2))
    print("parity: worst relative error of top-5 logprobs vs PyTorch %.2e" % worst)
    if worst >= 1e-3:
        fails.append("parity: relative error %.2e >= 1e-3" % worst)


def accuracy(port):
    rng = np.random.default_rng(10**9 + 2026)
    ok_what = ok_cnt = 0
    for i in range(N):
        img, objs = S.make_image(rng, 1)
        a = ask(port, S.Q_WHAT, img).lower()
        good = objs[0][0] in a and objs[0][1] in a
        ok_what += good
        if not good and len(fails) < 5:
            print("  miss: %s -> %r" % (objs, a))
    for i in range(N):
        img, objs = S.make_image(rng)
        a = ask(port, S.Q_COUNT, img).lower()
        ok_cnt += S.NUM[len(objs)] in a.split(" ") or S.NUM[len(objs)] + "." in a
    pw, pc = ok_what / N, ok_cnt / N
    print("accuracy: 'What is in this image?' %d/%d = %.1f%% (colour and shape named)" % (ok_what, N, 100 * pw))
    print("accuracy: 'How many shapes are there?' %d/%d = %.1f%%" % (ok_cnt, N, 100 * pc))
    if pw < 0.95:
        fails.append("what-is-in-this-image accuracy %.3f < 0.95" % pw)
    if pc < 0.90:
        fails.append("count accuracy %.3f < 0.90" % pc)


def bundled(port):
    png = open(os.path.join(ROOT, "models", "red-square.png"), "rb").read()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    r = post(port, "/v1/chat/completions", {"temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": S.Q_WHAT}]}]})
    a = r["choices"][0]["message"]["content"]
    print("README: models/red-square.png, %r -> %r" % (S.Q_WHAT, a))
    if "red square" not in a.lower():
        fails.append("the README's picture: %r does not say red square" % a)


def text(port):
    for a, b in ((3, 4), (2, 5), (7, 1), (9, 9)):
        r = ask(port, "What is %d + %d?" % (a, b))
        print("text: 'What is %d + %d?' -> %r" % (a, b, r))
        if str(a + b) not in r.replace("%d + %d" % (a, b), ""):
            fails.append("arithmetic %d + %d: %r" % (a, b, r))
    for q, want in (("Hello", "hello"), ("What shapes do you know?", "circle"),
                    ("How many sides does a triangle have?", "three")):
        r = ask(port, q)
        print("text: %r -> %r" % (q, r))
        if want not in r.lower():
            fails.append("text %r: %r (expected %r in it)" % (q, r, want))


def main():
    tide = os.environ.get("TIDE_BIN", os.path.join(ROOT, "build", "tide"))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = tempfile.TemporaryFile()
    p = subprocess.Popen([tide, "--config", os.path.join(ROOT, "config", "tide.json"), "--port", str(port),
                          "--model", os.path.join(ROOT, "models", "tide-shapes.gguf"),
                          "--mmproj", os.path.join(ROOT, "models", "tide-shapes-mmproj.gguf")],
                         cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.time()
    try:
        for _ in range(1200):
            try:
                # /health is 200 once the model is loaded (/v1/models answers while it loads:
                # a first request then got 503 "model is loading" on a busy CI machine)
                urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2).read()
                break
            except Exception:
                if p.poll() is not None:
                    break
                time.sleep(0.1)
        template(os.path.join(os.path.dirname(tide), "tide-jinja"))
        parity(port)
        bundled(port)
        text(port)
        accuracy(port)
        tools(port)
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
        if fails:
            log.seek(0)
            print("--- tide log (tail)\n" + log.read().decode(errors="replace")[-1500:])
    print("test_model: %.1f s" % (time.time() - t0))
    if fails:
        for f in fails:
            print("FAIL test_model: " + f)
        sys.exit(1)
    print("PASS test_model")


if __name__ == "__main__":
    main()
