#!/usr/bin/env python3
"""bench-decode-depth.py - one stream's decode rate deep in a context, through a running tide.

Sends a DEPTH-token prompt of random token ids (ids 3..VOCAB-1) to /v1/completions, streams
GEN tokens greedily with ignore_eos, and takes the rate from the first streamed chunk to the
last: the prompt's prefill is outside the measurement (bench-cpu.py's tgD subtracts two
prefills' times instead, which a busy machine makes noisy at large depths). RUNS requests.
Usage: bench-decode-depth.py URL DEPTH GEN [RUNS (2)] [VOCAB (771)]
Prints the tok/s of each request.
"""
import json
import random
import sys
import time
import urllib.request

url, depth, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 2
vocab = int(sys.argv[5]) if len(sys.argv) > 5 else 771
rng = random.Random()


def one():
    prompt = [rng.randrange(3, vocab) for _ in range(depth)]
    body = {"prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True, "stream": True}
    r = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(r, timeout=900) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


print(" ".join("%.1f" % one() for _ in range(runs)))
