#!/usr/bin/python3
"""test_batching.py - many requests at once through the real daemon (CPU devices).

Starts $TIDE_BIN on free loopback ports with the plumbing model (models/tide-moe.gguf) and checks
what a client sees when requests run together:
 1. overlap: 4 concurrent streams each receive their first content chunk before any of them
    finishes (the server runs them in one batch, not one after another);
 2. mixed load: 16 concurrent clients with mixed prompt lengths, stop strings, n > 1, streams and
    non-streams, greedy and seeded sampling, and 3 clients that hang up mid-stream: every completed
    reply equals the reply the same request gets alone;
 3. prefix cache: a prompt sent again reports usage.prompt_tokens_details.cached_tokens > 0 (0 the
    first time), in plain and streamed replies, with the same text; /metrics counts reused tokens;
 4. conversation parking: with one KV slot, a conversation whose slot another prompt took comes back
    from host RAM (cached_tokens, the same greedy text as its first reply; /metrics and /v1/vram
    count it); without a budget (kv_host_mib 0) it is computed again; a budget the host cannot
    hold stops start-up with the numbers;
 5. image prefix: an image's rows are reused for the same image bytes at the same place (a second
    ask, a follow-up turn), with the same text, and never for another image of the same size;
 6. vision under load: an image request arrives while 8 text streams run on a CPU device with a
    memory budget (64 MiB: 38 free, the encoder's reserve 41): the caches hand slots back to the encoder at a step boundary and regrow to the
    same count after idle_s; the 8 streams' texts are unchanged, and none errs;
 7. one sequence at a time (TIDE_ONE_SEQUENCE=1, a diagnostic):
    3 concurrent streams with 4 slots run one after another, each with the text it gets alone.
Usage: tests/e2e/test_batching.py   (env: TIDE_BIN). Prints "N passed, N failed".
"""
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("TIDE_BIN", os.path.join(ROOT, "build", "tide"))
MODEL = os.path.join(ROOT, "models", "tide-moe.gguf")
MMPROJ = os.path.join(ROOT, "models", "tide-mmproj.gguf")
results = []


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Daemon:
    def __init__(self, cfg, env=None):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="tide-batch-")
        path = os.path.join(self.dir, "cfg.json")
        base = {"model": MODEL, "mmproj": None, "context": 1024, "port": self.port}
        base.update(cfg)
        json.dump(base, open(path, "w"))
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.p = subprocess.Popen([BIN, "--config", path], stdout=self.log, stderr=subprocess.STDOUT,
                                  env=dict(os.environ, **(env or {})))
        for _ in range(600):
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            if self.p.poll() is not None:
                raise RuntimeError("daemon exited: " + open(os.path.join(self.dir, "log")).read()[-500:])
            time.sleep(0.1)
        raise RuntimeError("daemon not healthy")

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def get(self, path):
        with urllib.request.urlopen(self.url(path), timeout=60) as r:
            return r.status, r.read().decode()

    def vram(self):
        return json.loads(self.get("/v1/vram")[1])

    def post(self, path, body, timeout=300):
        r = urllib.request.Request(self.url(path), json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(r, timeout=timeout) as f:
            return json.loads(f.read())

    def stream(self, path, body, hang_up_after=None):
        """(texts by choice, first-content time, end time, usage, error event or None)"""
        r = urllib.request.Request(self.url(path), json.dumps(body).encode(), {"Content-Type": "application/json"})
        texts, first, usage, err, chunks = {}, None, None, None, 0
        with urllib.request.urlopen(r, timeout=300) as resp:
            for line in resp:
                line = line.strip()
                if line == b"data: [DONE]":
                    break
                if not line.startswith(b"data: "):
                    continue
                o = json.loads(line[6:])
                if "error" in o:
                    err = o["error"]
                    continue
                if o.get("usage"):
                    usage = o["usage"]
                for c in o.get("choices", []):
                    piece = c.get("delta", {}).get("content") if "delta" in c else c.get("text")
                    if piece:
                        texts[c["index"]] = texts.get(c["index"], "") + piece
                        first = first or time.perf_counter()
                        chunks += 1
                        if hang_up_after and chunks >= hang_up_after:
                            return texts, first, None, usage, "hung up"
        return texts, first, time.perf_counter(), usage, err

    def stop(self):
        self.p.terminate()
        try:
            rc = self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = -9
        self.log.close()
        return rc


def check(name, ok, detail=""):
    results.append(ok)
    print(("ok   " if ok else "FAIL ") + name + (": " + detail if detail else ""), flush=True)


def report():
    """Prints "N passed, N failed" and exits 1 when any check failed."""
    npass = sum(results)
    print("%d passed, %d failed" % (npass, len(results) - npass))
    sys.exit(0 if npass == len(results) else 1)


def run_threads(fns):
    out = [None] * len(fns)

    def wrap(i):
        try:
            out[i] = fns[i]()
        except Exception as e:  # noqa: BLE001 - reported as the result
            out[i] = e
    th = [threading.Thread(target=wrap, args=(i,)) for i in range(len(fns))]
    [t.start() for t in th]
    [t.join() for t in th]
    return out


def chat_body(text, **kw):
    b = {"messages": [{"role": "user", "content": text}], "max_tokens": 40, "temperature": 0}
    b.update(kw)
    return b


def reply_texts(d, path, body):
    """The choices' texts of a request, whichever way it is sent."""
    if body.get("stream"):
        texts, _, _, _, err = d.stream(path, body)
        assert err is None, err
        return [texts.get(i, "") for i in range(body.get("n", 1))]
    o = d.post(path, body)
    ch = sorted(o["choices"], key=lambda c: c["index"])
    return [c["message"]["content"] if "message" in c else c["text"] for c in ch]


def overlap(d):
    asks = ["Tell me about rivers.", "Describe a city at night.", "List some colours.", "Explain the tides."]
    res = run_threads([lambda a=a: d.stream("/v1/chat/completions", chat_body(a, max_tokens=120, stream=True))
                       for a in asks])
    bad = [r for r in res if isinstance(r, Exception)]
    if bad:
        return check("overlap", False, repr(bad[0]))
    end = min(r[2] for r in res)
    started = sum(1 for r in res if r[1] is not None and r[1] < end)
    check("overlap: 4 streams each started before the first finished", started == 4, "%d/4" % started)


def one_sequence():
    asks = ["Tell me about rivers.", "Describe a city at night.", "List some colours."]
    # every token at least 5 ms (a fault hook), so a stream lasts 0.3 s and overlaps show plainly
    d = Daemon({"parallel": 4}, env={"TIDE_ONE_SEQUENCE": "1", "TIDE_FAULT_SLOW_TOKEN_MS": "5"})
    try:
        alone = [reply_texts(d, "/v1/chat/completions", chat_body(a, max_tokens=60, stream=True)) for a in asks]
        res = run_threads([lambda a=a: d.stream("/v1/chat/completions", chat_body(a, max_tokens=60, stream=True))
                           for a in asks])
        bad = [r for r in res if isinstance(r, Exception) or r[4] is not None]
        if bad:
            return check("one sequence at a time", False, repr(bad[0]))
        spans = sorted((r[1], r[2]) for r in res)
        # each stream's first token comes after the one before it ended (50 ms for the client's clock)
        serial = all(spans[i + 1][0] >= spans[i][1] - 0.05 for i in range(len(spans) - 1))
        check("one sequence at a time: 3 streams with 4 slots ran one after another", serial, repr(spans))
        same = [[r[0].get(0, "")] for r in res] == alone
        check("one sequence at a time: each text is its text alone", same)
    finally:
        check("daemon exits 0 on SIGTERM", d.stop() == 0)


def mixed(d):
    words = "the river runs past a city of shapes and colours under a quiet sky".split()
    reqs = []
    for i in range(16):
        text = " ".join(words[: 2 + (i * 5) % len(words)]) * (1 + i % 4)
        kind = i % 4
        if kind == 0:
            body = chat_body(text, max_tokens=30 + i, stream=True)
        elif kind == 1:
            body = chat_body(text, max_tokens=25, stop=["e", "\n"])
        elif kind == 2:
            body = chat_body(text, max_tokens=20, n=2, temperature=1, seed=100 + i, stream=(i % 8 == 2))
        else:
            body = {"prompt": text, "max_tokens": 24, "temperature": 0.7, "seed": i}
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        reqs.append((path, body))
    alone = [reply_texts(d, p, b) for p, b in reqs]
    hang = [(p, dict(b, stream=True, max_tokens=200)) for p, b in reqs[:3]]
    fns = [lambda p=p, b=b: reply_texts(d, p, b) for p, b in reqs]
    fns += [lambda p=p, b=b: d.stream(p, b, hang_up_after=3) for p, b in hang]
    got = run_threads(fns)
    errs = [g for g in got if isinstance(g, Exception)]
    same = sum(1 for i in range(16) if got[i] == alone[i])
    check("mixed load: 16 replies equal their solo replies (3 clients hung up)", same == 16 and not errs,
          "%d/16 equal%s" % (same, "; " + repr(errs[0]) if errs else ""))
    # after the load the server is idle again and answers as before
    check("mixed load: served alone afterwards, unchanged", reply_texts(d, *reqs[0]) == alone[0])


def prefix_cache(d):
    system = "You are a careful assistant who answers about shapes. " * 6
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "Name a colour."}],
            "max_tokens": 16, "temperature": 0}
    a = d.post("/v1/chat/completions", body)
    b = d.post("/v1/chat/completions", body)
    ca = a["usage"]["prompt_tokens_details"]["cached_tokens"]
    cb = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    same = a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    check("prefix cache: cached_tokens 0 then > 0, same text", ca == 0 and 0 < cb < b["usage"]["prompt_tokens"]
          and same, "first %d, again %d of %d" % (ca, cb, b["usage"]["prompt_tokens"]))
    body2 = dict(body, messages=body["messages"][:1] + [{"role": "user", "content": "Name a shape."}], stream=True,
                 stream_options={"include_usage": True})
    texts, _, _, usage, err = d.stream("/v1/chat/completions", body2)
    cs = usage["prompt_tokens_details"]["cached_tokens"] if usage else -1
    check("prefix cache: a shared system prompt is reused, reported in the streamed usage", err is None and cs > 0,
          "cached %d" % cs)
    m = d.get("/metrics")[1]
    reused = [ln for ln in m.splitlines() if ln.startswith("tide_prompt_tokens_cached_total ")]
    check("prefix cache: /metrics counts reused tokens", bool(reused) and float(reused[0].split()[1]) >= cb + cs,
          reused[0] if reused else "no tide_prompt_tokens_cached_total")


def metric(d, name):
    for ln in d.get("/metrics")[1].splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    return None


def parking():
    story = "The harbour town keeps its boats painted in bright colours, and every spring the fishermen " * 8
    a = chat_body(story + "What colour are the boats?", max_tokens=12)
    other = chat_body("Count some shapes for me, please. " * 6, max_tokens=4)
    for budget in (64, 0):
        # the prefix index off (TIDE_KV_SHARE=0), else the story's whole blocks would still be found
        # in the pool (tests/e2e/test_kv_blocks.py checks the index, and the two together)
        d = Daemon({"parallel": 1, "kv_host_mib": budget}, env={"TIDE_KV_SHARE": "0"})
        try:
            first = d.post("/v1/chat/completions", a)
            d.post("/v1/chat/completions", other)  # takes the only slot: the story is parked (or lost)
            again = d.post("/v1/chat/completions", a)
            pt = again["usage"]["prompt_tokens"]
            cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
            same = first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
            if budget:
                v = d.vram()["sequences"]
                check("parking: a conversation whose slot was taken comes back from host RAM, same text",
                      cached == pt - 1 and same, "cached %d of %d, same text %s" % (cached, pt, same))
                check("parking: /metrics and /v1/vram count it",
                      # the rows past those the slot kept (the template's head, shared with the other prompt)
                      metric(d, "tide_kv_restored_total") == 1 and pt - 1 - 32 < metric(d, "tide_kv_restored_tokens_total") < pt - 1
                      and metric(d, "tide_kv_parked_conversations") >= 1 and v["parked"] >= 1 and v["parked_budget_mib"] == 64,
                      "restored %s tokens %s parked %s, vram %s" % (metric(d, "tide_kv_restored_total"),
                                                                   metric(d, "tide_kv_restored_tokens_total"),
                                                                   metric(d, "tide_kv_parked_conversations"), v))
            else:
                # only the template's head (shared with the other prompt) is still in the slot
                check("parking off (kv_host_mib 0): recomputed, same text", cached < 16 and same
                      and metric(d, "tide_kv_parked_total") == 0, "cached %d, same %s" % (cached, same))
        finally:
            check("daemon exits 0 on SIGTERM", d.stop() == 0)
    try:
        Daemon({"kv_host_mib": 1 << 24})
        check("parking: a budget the host cannot hold is refused at start-up", False, "daemon started")
    except RuntimeError as e:
        check("parking: a budget the host cannot hold is refused at start-up, naming the numbers",
              "kv_host_mib 16777216 MiB does not fit" in str(e) and "MiB of RAM" in str(e), str(e)[-300:])


def png_bytes(rgb, size=32):
    """A solid-colour PNG (zlib and struct only)."""
    import struct
    import zlib
    raw = b"".join(b"\x00" + bytes(rgb) * size for _ in range(size))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def image_prefix():
    def ask(png, text, history=()):
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": text}]}] + list(history)
        return {"messages": msgs, "max_tokens": 12, "temperature": 0}
    red, blue = png_bytes((200, 30, 30)), png_bytes((30, 30, 200))
    d = Daemon({"mmproj": MMPROJ, "parallel": 1, "kv_host_mib": 64})
    try:
        first = d.post("/v1/chat/completions", ask(red, "What colour is this?"))
        again = d.post("/v1/chat/completions", ask(red, "What colour is this?"))
        pt = again["usage"]["prompt_tokens"]
        ca = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        same = first["choices"][0]["message"]["content"] == again["choices"][0]["message"]["content"]
        check("image prefix: the same image again reuses its rows, same text", ca == pt - 1 and same,
              "cached %d of %d, same %s" % (ca, pt, same))
        other = d.post("/v1/chat/completions", ask(blue, "What colour is this?"))
        co = other["usage"]["prompt_tokens_details"]["cached_tokens"]
        check("image prefix: another image of the same size is not reused", co < pt // 2,
              "cached %d of %d" % (co, other["usage"]["prompt_tokens"]))
        reply = first["choices"][0]["message"]["content"]
        turn = d.post("/v1/chat/completions", ask(red, "What colour is this?", [
            {"role": "assistant", "content": reply}, {"role": "user", "content": "Are you sure?"}]))
        ct = turn["usage"]["prompt_tokens_details"]["cached_tokens"]
        check("image prefix: a follow-up turn about the same image reuses the first turn's rows (parked, restored)",
              ct >= pt - 1, "cached %d, first turn's prompt %d" % (ct, pt))
        fresh = Daemon({"mmproj": MMPROJ, "parallel": 1, "kv_host_mib": 0})
        try:
            solo = fresh.post("/v1/chat/completions", ask(red, "What colour is this?", [
                {"role": "assistant", "content": reply}, {"role": "user", "content": "Are you sure?"}]))
        finally:
            fresh.stop()
        check("image prefix: the follow-up's text equals a fresh daemon's",
              solo["choices"][0]["message"]["content"] == turn["choices"][0]["message"]["content"]
              and solo["usage"]["prompt_tokens_details"]["cached_tokens"] == 0)
    finally:
        check("daemon exits 0 on SIGTERM", d.stop() == 0)


def slots(v):
    return v["totals"]["expert_slots"]


def vision_under_load():
    png = open(os.path.join(ROOT, "models", "red-square.png"), "rb").read()
    img = "data:image/png;base64," + base64.b64encode(png).decode()
    # 55 MiB: nine f16 KV slots of 1024 rows take 9 MiB, so the encoder's 41 MiB need the caches'
    # segments as with f32 slots in 64 MiB
    d = Daemon({"mmproj": MMPROJ, "devices": [{"backend": "cpu", "vram_mib": 55}], "parallel": 9,
                "vision": {"lazy": True, "idle_s": 2, "vram_mib": 41}})
    try:
        asks = ["Stream number %d, tell me a story." % i for i in range(8)]
        bodies = [chat_body(a, max_tokens=150, stream=True) for a in asks]
        alone = [reply_texts(d, "/v1/chat/completions", b) for b in bodies]
        v0 = d.vram()
        full = slots(v0)
        picture = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img}},
                                                             {"type": "text", "text": "What is in this image?"}]}],
                   "max_tokens": 8, "temperature": 0}
        seen = {}

        def image_later():
            time.sleep(0.3)  # the streams are running by now
            seen["during"] = d.vram()["vision"]["state"]
            r = d.post("/v1/chat/completions", picture)
            seen["after"] = d.vram()
            return r
        out = run_threads([lambda b=b: d.stream("/v1/chat/completions", b) for b in bodies] + [image_later])
        errs = [o for o in out if isinstance(o, Exception)]
        texts = [[o[0].get(0, "")] if not isinstance(o, Exception) else None for o in out[:8]]
        stream_errs = [o[4] for o in out[:8] if not isinstance(o, Exception) and o[4]]
        check("vision under load: no errors", not errs and not stream_errs, repr((errs + stream_errs)[:1]))
        same = sum(1 for i in range(8) if texts[i] == alone[i])
        check("vision under load: the 8 streams equal their solo texts", same == 8, "%d/8" % same)
        ready = seen.get("after")
        handed = ready is not None and ready["vision"]["state"] == "ready" and slots(ready) < full
        check("vision under load: the caches handed slots back for the encoder", handed,
              "slots %s -> %s" % (full, slots(ready) if ready else None))
        for _ in range(100):
            v = d.vram()
            if v["vision"]["state"] == "unloaded":
                break
            time.sleep(0.1)
        check("vision under load: unloaded after idle_s and regrown to the same slot count",
              v["vision"]["state"] == "unloaded" and slots(v) == full, "slots %s, before %s" % (slots(v), full))
    finally:
        check("vision under load: clean exit on SIGTERM", d.stop() == 0)


def main():
    d = Daemon({"parallel": 4})
    try:
        prefix_cache(d)  # first: a fresh daemon's slots hold nothing yet
        overlap(d)
    finally:
        check("daemon exits 0 on SIGTERM", d.stop() == 0)
    d = Daemon({"parallel": 8})
    try:
        mixed(d)
    finally:
        check("daemon exits 0 on SIGTERM", d.stop() == 0)
    one_sequence()
    parking()
    image_prefix()
    vision_under_load()
    report()


if __name__ == "__main__":
    main()
