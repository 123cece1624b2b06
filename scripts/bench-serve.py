#!/usr/bin/env python3
"""bench-serve.py - N concurrent clients against an OpenAI-compatible server (tide or llama-server).

Each client sends one streamed chat request of up to MAX_TOKENS tokens (no ignore_eos: in tide
it makes every step bring the logits to the host, unless TIDE_DEVICE_SAMPLE_EXTRAS=1), with a
distinct prompt, or with a shared system prompt of about SHARED words in front (--shared). Reports, per run:
  aggregate tok/s = completion tokens of all replies / wall time from the first send to the last
  reply's end; the slowest reply (s); p50/p99 inter-token latency over all streams (ms), from the
  arrival times of content chunks; time to first token p50/p99 (s); the prompt tokens of all
  replies and those of them reported as cached (usage.prompt_tokens_details.cached_tokens).
--ban LO-HI sends a logit_bias of -100 for token ids LO..HI in every request (both servers alike):
llama-server answers 500 when a reply is not valid UTF-8, which a random-weight model's byte
tokens make (the model tool's vocabulary has them at 128-255).
Usage: bench-serve.py URL N [--temperature T] [--max-tokens M] [--shared WORDS] [--ban LO-HI] [--label L]
                       [--presence-penalty P] [--logprobs K]
--presence-penalty (default $BENCH_PRESENCE_PENALTY, else 0: not sent) and --logprobs K (default
$BENCH_LOGPROBS, else -1: not sent; K >= 0 sends logprobs with top_logprobs K) measure what the
sampler's extras cost a sampled decode (issue 21: within 5% of greedy is the target).
Prints one line of key=value pairs (also appended to --out FILE as JSON).
"""
import argparse
import json
import os
import threading
import time
import urllib.request

WORDS = ("river city colour shape light tide stone field cloud market window garden bridge "
         "harbour lantern forest mirror engine letter island").split()


def prompt(i, n_words):
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n_words))


def one(url, body, out, i):
    t0 = time.perf_counter()
    times, ntok, usage = [], 0, None
    r = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=900) as resp:
            for line in resp:
                line = line.strip()
                if line == b"data: [DONE]":
                    break
                if not line.startswith(b"data: "):
                    continue
                o = json.loads(line[6:])
                if o.get("usage"):
                    usage = o["usage"]
                for c in o.get("choices", []):
                    # llama-server may put the text in reasoning_content (its reasoning parser on a
                    # Qwen3-style template): a token either way
                    d = c.get("delta", {})
                    if d.get("content") or d.get("reasoning_content"):
                        times.append(time.perf_counter())
                        ntok += 1
    except Exception as e:  # noqa: BLE001 - counted as an error
        out[i] = {"error": repr(e)}
        return
    gen = usage["completion_tokens"] if usage else ntok
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    out[i] = {"t0": t0, "end": time.perf_counter(), "times": times, "tokens": gen, "cached": cached,
              "prompt": (usage or {}).get("prompt_tokens", 0)}


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("n", type=int)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--shared", type=int, default=0)
    ap.add_argument("--ban", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--presence-penalty", type=float, default=float(os.environ.get("BENCH_PRESENCE_PENALTY", "0")))
    ap.add_argument("--logprobs", type=int, default=int(os.environ.get("BENCH_LOGPROBS", "-1")))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    system = prompt(999, a.shared) if a.shared else None
    bodies = []
    for i in range(a.n):
        msgs = ([{"role": "system", "content": system}] if system else []) + \
               [{"role": "user", "content": "%d: %s" % (i, prompt(i, 12))}]
        bodies.append({"messages": msgs, "max_tokens": a.max_tokens, "temperature": a.temperature, "seed": i,
                       "stream": True, "stream_options": {"include_usage": True}})
        if a.ban:
            lo, hi = (int(v) for v in a.ban.split("-"))
            bodies[-1]["logit_bias"] = {str(t): -100 for t in range(lo, hi + 1)}
        if a.presence_penalty:
            bodies[-1]["presence_penalty"] = a.presence_penalty
        if a.logprobs >= 0:
            bodies[-1]["logprobs"] = True
            bodies[-1]["top_logprobs"] = a.logprobs
    out = [None] * a.n
    th = [threading.Thread(target=one, args=(a.url, bodies[i], out, i)) for i in range(a.n)]
    t0 = time.perf_counter()
    [t.start() for t in th]
    [t.join() for t in th]
    errs = [o for o in out if "error" in o]
    ok = [o for o in out if "error" not in o]
    wall = max(o["end"] for o in ok) - t0 if ok else float("nan")
    toks = sum(o["tokens"] for o in ok)
    itl = [(b - a_) * 1e3 for o in ok for a_, b in zip(o["times"], o["times"][1:])]
    ttft = [o["times"][0] - o["t0"] for o in ok if o["times"]]
    res = {"label": a.label, "clients": a.n, "temperature": a.temperature, "shared_words": a.shared,
           "presence_penalty": a.presence_penalty, "logprobs": a.logprobs,
           "errors": len(errs), "tokens": toks, "wall_s": round(wall, 3),
           "aggregate_tok_s": round(toks / wall, 1) if ok else 0,
           "slowest_s": round(max(o["end"] - o["t0"] for o in ok), 3) if ok else None,
           "itl_p50_ms": round(pct(itl, 50), 2), "itl_p99_ms": round(pct(itl, 99), 2),
           "ttft_p50_s": round(pct(ttft, 50), 3), "ttft_p99_s": round(pct(ttft, 99), 3),
           "prompt_tokens": sum(o["prompt"] for o in ok), "cached_tokens": sum(o["cached"] for o in ok)}
    print(" ".join("%s=%s" % kv for kv in res.items()), flush=True)
    if errs:
        print("first error:", errs[0]["error"])
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
