#!/usr/bin/env python3
"""bench-cpu.py - one tide measurement through the HTTP API, for scripts/bench-cpu.sh.

Against a running tide (URL), with random token-id prompts (each request's first token is new,
so no KV rows are reused from an earlier request):
  pp  = PROMPT / the time of a PROMPT-token request with max_tokens 1: the prefill, as
        llama-bench's ppN at depth 0 (plus one HTTP round trip and one decode step);
  tgD = GEN / (the time of a DEPTH-token request generating GEN + 1 tokens with ignore_eos -
        that of one generating 1): GEN decode steps at depth DEPTH..DEPTH+GEN, as llama-bench's
        tgN at -d DEPTH (for each DEPTH given). (Streamed chunks' arrival times were tried and
        dropped: on a loaded machine they arrive in bursts.)
One warm-up request first (the first touch of each mmapped page is a page fault).
With TIDE_PID (the daemon's pid) also ppNcpu and tgD...cpu: tokens per CPU-second of the daemon
(utime + stime from /proc), which a busy neighbour does not change the way it changes wall time
(up to cache sharing; at 2 threads a pool that spins would count its spinning).
Usage: bench-cpu.py URL VOCAB PROMPT GEN DEPTH[,DEPTH...]
Prints key=value pairs: pp=<tok/s> tg<D>=<tok/s> ...
"""
import json
import os
import random
import sys
import time
import urllib.request

url, vocab, n_prompt, n_gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
depths = [int(d) for d in sys.argv[5].split(",")]
rng = random.Random()
serial = [0]


def tokens(n):
    serial[0] += 1
    first = 3 + (serial[0] * 97 + rng.randrange(vocab)) % (vocab - 3)
    return [first] + [rng.randrange(3, vocab) for _ in range(n - 1)]


def request(prompt, max_tokens):
    """the seconds from sending to the end of the reply (not streamed), and its tokens"""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(r, timeout=900) as resp:
        used = json.loads(resp.read())["usage"]["completion_tokens"]
    return time.perf_counter() - t0, used


def cpu_seconds():
    """the daemon's CPU time so far (TIDE_PID), or 0 without one"""
    pid = os.environ.get("TIDE_PID")
    if not pid:
        return 0.0
    with open("/proc/%s/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(prompt, max_tokens):
    """request()'s seconds and tokens, and the daemon's CPU seconds over it"""
    c0 = cpu_seconds()
    t, used = request(prompt, max_tokens)
    return t, used, cpu_seconds() - c0


request(tokens(64), 8)  # warm-up
out = []
t, _, c = timed(tokens(n_prompt), 1)
out.append("pp%d=%.1f" % (n_prompt, n_prompt / t))
cpu = ["pp%dcpu=%.1f" % (n_prompt, n_prompt / c)] if c > 0 else []
for d in depths:
    # the same prompt length twice, one token and GEN + 1: the difference is GEN decode steps
    t1, _, c1 = timed(tokens(max(d, 1)), 1)
    tn, used, cn = timed(tokens(max(d, 1)), n_gen + 1)
    out.append("tg%d@d%d=%.1f" % (n_gen, d, (used - 1) / (tn - t1)))
    if cn > c1:
        cpu.append("tg%d@d%dcpu=%.1f" % (n_gen, d, (used - 1) / (cn - c1)))
print(" ".join(out + cpu))
