#!/usr/bin/python3
"""test_prefix_share.py - a prompt's prefix reused across running sequences (engine/prefix_share.h),
through the real daemon (CPU devices, the plumbing model):
 1. 8 clients at once with one long system prompt: every reply equals the one the same request gets
    with nothing reused (a daemon with one slot, no parking, no waiting, and another prompt between
    two requests), bit for bit on the CPU; all but the first report cached_tokens for the system
    prompt (chat, streamed too), the others waited for the first one's rows, and /metrics counts the
    tokens copied between slots and the waits;
 2. the same for /v1/completions;
 3. image rows: of 2 clients at once with the same image and text, one takes the other's rows (all but
    the last); a third with another image of the same size at the same place takes none of the image's;
    each text is its text alone;
 4. the sequence computing a shared prefix is cancelled (its client hangs up mid-prefill) while 3
    others wait for it: they are answered, with the text they get alone.
The steps are slowed (TIDE_FAULT_SLOW_TOKEN_MS) and a prompt runs in 64-row chunks, so the clients
arrive while the first one still prefills. Usage: tests/e2e/test_prefix_share.py (env: TIDE_BIN).
"""
import base64
import os
import socket
import sys
import time
import json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_batching import MMPROJ, Daemon, check, metric, png_bytes, report, run_threads  # noqa: E402 - the shared harness

SLOW = {"TIDE_FAULT_SLOW_TOKEN_MS": "20"}
SYSTEM = ("You are a careful assistant for a harbour town. The boats are painted in bright colours, the nets "
          "are mended every spring, and the lighthouse keeper writes the tides in a book. ") * 5
ASKS = ["Name a colour.", "What is a net?", "Who keeps the book?", "Describe the tide.",
        "Count the boats.", "Where is the lighthouse?", "When are nets mended?", "Say hello."]


def chat(ask, i):
    b = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}], "max_tokens": 12,
         "temperature": 0}
    if i % 4 == 1:
        b.update(temperature=0.8, seed=40 + i)
    if i % 2:
        b.update(stream=True, stream_options={"include_usage": True})
    return b


def send(d, path, body):
    """(text, usage) of a request, streamed or not"""
    if body.get("stream"):
        texts, _, _, usage, err = d.stream(path, body)
        assert err is None, err
        return texts.get(0, ""), usage
    o = d.post(path, body)
    c = o["choices"][0]
    return (c["message"]["content"] if "message" in c else c["text"]), o["usage"]


def alone(reqs):
    """each request with nothing reused: one slot, no parking, no waits, no prefix index
    (TIDE_KV_SHARE=0), another prompt in between"""
    d = Daemon({"parallel": 1, "kv_host_mib": 0, "prefix_wait_tokens": 0, "context": 4096}, env={"TIDE_KV_SHARE": "0"})
    out = []
    try:
        for path, body in reqs:
            d.post("/v1/completions", {"prompt": "Count some shapes for me, please.", "max_tokens": 2})
            out.append(send(d, path, body))
    finally:
        d.stop()
    return out


def together(d, reqs, name):
    ref = alone(reqs)
    got = run_threads([lambda p=p, b=b: send(d, p, b) for p, b in reqs])
    errs = [g for g in got if isinstance(g, Exception)]
    if errs:
        return check(name + ": answered", False, repr(errs[0]))
    same = sum(1 for g, r in zip(got, ref) if g[0] == r[0])
    check(name + ": %d replies equal their replies with nothing reused" % len(reqs), same == len(reqs),
          "%d/%d" % (same, len(reqs)))
    cached = sorted(g[1]["prompt_tokens_details"]["cached_tokens"] for g in got)
    n_prompt = min(g[1]["prompt_tokens"] for g in got)
    check(name + ": all but the first report the shared prefix in cached_tokens",
          cached[0] < 10 and all(c >= n_prompt - 40 for c in cached[1:]) and
          all(r[1]["prompt_tokens_details"]["cached_tokens"] < 10 for r in ref),
          "cached %s of >= %d prompt tokens" % (cached, n_prompt))
    return sum(cached)


def shared_system_prompt():
    d = Daemon({"parallel": 8, "max_batch_tokens": 64, "context": 4096}, env=SLOW)
    try:
        total = together(d, [("/v1/chat/completions", chat(a, i)) for i, a in enumerate(ASKS)], "chat")
        shared, waits = metric(d, "tide_kv_shared_tokens_total"), metric(d, "tide_kv_prefix_waits_total")
        indexed = metric(d, "tide_kv_block_cache_tokens_total")
        check("chat: /metrics counts the copied rows, the rows found in the prefix index and the waits",
              shared + indexed == total and waits >= 1 and metric(d, "tide_prompt_tokens_cached_total") >= total,
              "shared %s, indexed %s, waits %s, cached %d" % (shared, indexed, waits, total))
        comp = [("/v1/completions", {"prompt": SYSTEM + " Question %d:" % i, "max_tokens": 10, "temperature": 0,
                                      "stream": i == 1, "stream_options": {"include_usage": True}} if i == 1 else
                 {"prompt": SYSTEM + " Question %d:" % i, "max_tokens": 10, "temperature": 0})
                for i in range(3)]
        together(d, comp, "completions")
    finally:
        check("daemon exits 0 on SIGTERM", d.stop() == 0)


def until(cond, what, timeout=30):
    """Poll cond every 5 ms until it holds; an AssertionError naming what after timeout s."""
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout:
            raise AssertionError("not seen in %d s: %s" % (timeout, what))
        time.sleep(0.005)


def cancelled_leader():
    long_prompt = SYSTEM * 4 + "Now the question:"
    body = {"prompt": long_prompt, "max_tokens": 8, "temperature": 0}
    ref = alone([("/v1/completions", body)])[0][0]
    d = Daemon({"parallel": 4, "max_batch_tokens": 64, "context": 4096}, env=SLOW)
    try:
        raw = json.dumps(dict(body, stream=True)).encode()
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
        # The steps are signalled in /metrics, not guessed with sleeps (a loaded machine runs this
        # process late): the leader is admitted and prefills (27 chunks of 64 rows, >= 20 ms
        # each), then the 3 others wait for its rows, then it hangs up, well inside its prefill.
        until(lambda: (metric(d, "tide_requests_running") or 0) >= 1, "the leader admitted")
        fns = [lambda: send(d, "/v1/completions", body) for _ in range(3)]

        def hang_up():
            try:
                until(lambda: (metric(d, "tide_kv_prefix_waits_total") or 0) >= 3, "3 waiting for the leader's rows")
            finally:
                s.close()
        t0 = time.perf_counter()
        res = run_threads(fns + [hang_up])
        got = res[:3]
        dt = time.perf_counter() - t0
        errs = [g for g in res if isinstance(g, Exception)]
        check("cancelled leader: its 3 waiters are answered, with their text alone",
              not errs and all(g[0] == ref for g in got), "%.1f s; %s" % (dt, repr(errs[0]) if errs else
                                                                         [g[0] for g in got] + [ref]))
        check("cancelled leader: they waited for it", (metric(d, "tide_kv_prefix_waits_total") or 0) >= 3,
              "waits %s" % metric(d, "tide_kv_prefix_waits_total"))
        # it left mid-prefill: one waiter took the rows it had and computed the rest, the others
        # waited for that one (all of the prompt but its last row)
        cached = sorted(g[1]["prompt_tokens_details"]["cached_tokens"] for g in got) if not errs else []
        n = got[0][1]["prompt_tokens"] if not errs else 0
        check("cancelled leader: it left mid-prefill; the next one computed the rest for the others",
              len(cached) == 3 and 0 < cached[0] < n - 64 and cached[1] == cached[2] == n - 1,
              "cached %s of %d" % (cached, n))
    finally:
        check("daemon exits 0 on SIGTERM", d.stop() == 0)


def image_rows():
    def ask(png):
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": "What colour is this?"}]}],
                "max_tokens": 10, "temperature": 0}
    red, blue = png_bytes((200, 30, 30)), png_bytes((30, 30, 200))
    reqs = [ask(red), ask(red), ask(blue)]
    ref = []
    d = Daemon({"mmproj": MMPROJ, "parallel": 1, "kv_host_mib": 0, "prefix_wait_tokens": 0})
    try:
        for b in reqs:
            d.post("/v1/completions", {"prompt": "Count some shapes for me, please.", "max_tokens": 2})
            ref.append(d.post("/v1/chat/completions", b)["choices"][0]["message"]["content"])
    finally:
        d.stop()
    d = Daemon({"mmproj": MMPROJ, "parallel": 4, "max_batch_tokens": 64}, env=SLOW)
    try:
        got = run_threads([lambda b=b: d.post("/v1/chat/completions", b) for b in reqs])
        errs = [g for g in got if isinstance(g, Exception)]
        if errs:
            return check("image rows: answered", False, repr(errs[0]))
        pt = got[0]["usage"]["prompt_tokens"]
        reds = sorted(g["usage"]["prompt_tokens_details"]["cached_tokens"] for g in got[:2])
        cb = got[2]["usage"]["prompt_tokens_details"]["cached_tokens"]
        check("image rows: the same image's rows are shared between running sequences, another's are not",
              reds[0] < pt // 2 and reds[1] == pt - 1 and cb < pt // 2, "red %s, blue %d of %d" % (reds, cb, pt))
        check("image rows: each text is its text alone",
              [g["choices"][0]["message"]["content"] for g in got] == ref)
    finally:
        check("daemon exits 0 on SIGTERM", d.stop() == 0)


def main():
    shared_system_prompt()
    image_rows()
    cancelled_leader()
    report()


if __name__ == "__main__":
    main()
