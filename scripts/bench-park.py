#!/usr/bin/python3
"""bench-park.py - a conversation whose KV slot another prompt took: its rows found in the pool's
prefix index, restored from host RAM (parking, kv_host_mib), or computed again.

Starts $TIDE_BIN (default build/tide) three times on MODEL (default models/tide-moe.gguf) with one
KV slot: the prefix index alone (kv_host_mib 0), parking alone (kv_host_mib 256, TIDE_KV_SHARE=0)
and neither (kv_host_mib 0, TIDE_KV_SHARE=0). Each time: a long conversation A (WORDS words), then
an unrelated prompt B that takes the slot, then A again, REPS times; A's second reply is timed
(max_tokens 1: the time is the prompt's). Prints the median seconds and the cached tokens of
each. Usage: scripts/bench-park.py [--model M] [--words N] [--reps N] [--context N]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(port, body):
    r = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=600) as f:
        return json.loads(f.read())


def run(binary, model, budget, words, reps, context, env):
    port = free_port()
    d = tempfile.mkdtemp(prefix="tide-park-")
    cfg = os.path.join(d, "cfg.json")
    json.dump({"model": model, "mmproj": None, "context": context, "port": port, "parallel": 1,
               "kv_host_mib": budget}, open(cfg, "w"))
    log = open(os.path.join(d, "log"), "w")
    p = subprocess.Popen([binary, "--config", cfg], stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, **env))
    try:
        for _ in range(1200):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5)
                break
            except OSError:
                time.sleep(0.1)
        story = " ".join("word%d" % (i % 97) for i in range(words))
        a = {"messages": [{"role": "user", "content": story}], "max_tokens": 1, "temperature": 0}
        b = {"messages": [{"role": "user", "content": "Something else entirely."}], "max_tokens": 1,
             "temperature": 0}
        times, cached, prompt = [], [], 0
        post(port, a)
        for _ in range(reps):
            post(port, b)
            t0 = time.time()
            o = post(port, a)
            times.append(time.time() - t0)
            cached.append(o["usage"]["prompt_tokens_details"]["cached_tokens"])
            prompt = o["usage"]["prompt_tokens"]
        return statistics.median(times), min(times), max(times), prompt, statistics.median(cached)
    finally:
        p.terminate()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tide-moe.gguf"))
    ap.add_argument("--words", type=int, default=400)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--context", type=int, default=4096)
    o = ap.parse_args()
    binary = os.environ.get("TIDE_BIN", os.path.join(ROOT, "build", "tide"))
    off = {"TIDE_KV_SHARE": "0"}
    for label, budget, env in (("prefix index (kv_host_mib 0)", 0, {}), ("restore (kv_host_mib 256)", 256, off),
                               ("recompute (kv_host_mib 0)", 0, off)):
        med, lo, hi, pt, ca = run(binary, o.model, budget, o.words, o.reps, o.context, env)
        print("%-28s prompt %d tokens, cached %d: median %.3f s (%.3f-%.3f), %.0f prompt tok/s" %
              (label, pt, ca, med, lo, hi, pt / med))


if __name__ == "__main__":
    main()
