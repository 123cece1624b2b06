#!/usr/bin/python3
"""test_kv_blocks.py - the paged KV cache through the real daemon (CPU devices).

A pool of blocks smaller than the running sequences need (kv_pool_tokens: one context of 256
positions, in blocks of 16, for 4 sequences at once) makes the server pause the newest sequence
when the blocks run out and resume it later (engine/seq_pool.c). What a client sees:
 1. every one of 4 concurrent replies (greedy and seeded sampling, streamed and not, 200 tokens
    each with end-of-text masked, so together they need ~3x the pool) equals the reply the same
    request gets alone, and none errs; /metrics counts the pauses, and when all are done no
    sequence is paused and every block is free or cached;
 2. the same with conversation parking off (kv_host_mib 0): a paused sequence's rows are computed
    again instead of restored, with the same replies;
 3. clients that hang up while others are paused: the rest get their solo replies, and nothing is
    left paused or holding blocks;
 4. /v1/vram reports the pool (paged, block_rows, blocks and their states) and blocks shared in
    place by two prompts with one long prefix; a pool smaller than one context stops start-up
    with a clear error;
 5. the prefix index (engine/prefix_cache.c): with 2 slots and parking off, a conversation whose
    slot another prompt took comes back with its whole blocks found in the pool (cached_tokens,
    tide_kv_block_cache_tokens_total) and the same reply; with TIDE_KV_SHARE=0 they are computed;
    with parking on too, host RAM brings back only the rows past the index's blocks.
Usage: tests/e2e/test_kv_blocks.py   (env: TIDE_BIN). Prints "N passed, N failed".
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_batching import Daemon, check, metric, reply_texts, report, run_threads  # noqa: E402 - the shared harness

POOL = {"parallel": 4, "context": 256, "kv_block_size": 16, "kv_pool_tokens": 256}


def bodies():
    asks = ["Tell me about rivers.", "Describe a city at night.", "List some colours.", "Explain the tides."]
    out = []
    for i, a in enumerate(asks):
        b = {"messages": [{"role": "user", "content": a}], "max_tokens": 200, "ignore_eos": True,
             "temperature": 0 if i % 2 == 0 else 1.0, "seed": 11 + i, "stream": i >= 2}
        out.append(b)
    return out


def paused_then_equal(d, name):
    bs = bodies()
    alone = [reply_texts(d, "/v1/chat/completions", b) for b in bs]
    before = metric(d, "tide_kv_preemptions_total")
    together = run_threads([lambda b=b: reply_texts(d, "/v1/chat/completions", b) for b in bs])
    bad = [t for t in together if isinstance(t, Exception)]
    check(name + ": 4 concurrent replies, none errs", not bad, repr(bad[:1]))
    if bad:
        return
    same = sum(1 for a, t in zip(alone, together) if a == t)
    check(name + ": each reply equals the same request alone", same == 4, "%d/4 equal" % same)
    pauses = metric(d, "tide_kv_preemptions_total") - before
    check(name + ": the pool ran out and sequences were paused", pauses > 0, "%d pauses" % pauses)
    sq = d.vram()["sequences"]
    check(name + ": afterwards none is paused, no block is held by a running sequence",
          sq["paused"] == 0 and sq["blocks_running"] == 0 and sq["blocks_free"] + sq["blocks_cached"] == sq["blocks"],
          str({k: sq[k] for k in ("paused", "blocks", "blocks_running", "blocks_cached", "blocks_free")}))


def hang_ups(d):
    """Clients that hang up while the pool is out of blocks (some of them paused then): the others
    finish with their solo replies, and afterwards nothing is left paused or holding blocks."""
    bs = bodies()
    alone = [reply_texts(d, "/v1/chat/completions", b) for b in bs[:2]]
    before = metric(d, "tide_kv_preemptions_total")
    long = [dict(b, stream=True, max_tokens=240) for b in bodies()]
    res = run_threads([lambda b=bs[0]: reply_texts(d, "/v1/chat/completions", b),
                       lambda b=bs[1]: reply_texts(d, "/v1/chat/completions", b)] +
                      [lambda b=b: d.stream("/v1/chat/completions", b, hang_up_after=60) for b in long[2:]])
    kept = res[:2]
    check("hang-ups: the two who stayed get their solo replies", kept == alone,
          "equal %s" % [k == a for k, a in zip(kept, alone)])
    check("hang-ups: the pool ran out meanwhile", metric(d, "tide_kv_preemptions_total") > before)
    sq = {}
    for _ in range(100):
        sq = d.vram()["sequences"]
        if sq["running"] == 0:
            break
        time.sleep(0.1)
    check("hang-ups: afterwards nothing is running, paused or holding blocks",
          sq["running"] == 0 and sq["paused"] == 0 and sq["blocks_running"] == 0, str(sq))
    again = reply_texts(d, "/v1/chat/completions", bs[0])
    check("hang-ups: the next request gets its solo reply", again == alone[0])


def pool_report(d):
    sq = d.vram()["sequences"]
    check("vram: the pool is paged in blocks of 16, 16 blocks",
          sq.get("paged") is True and sq.get("block_rows") == 16 and sq.get("blocks") == 16, str(sq))
    long = "The quiet river runs past the old mill and under the stone bridge, " * 6
    a = {"messages": [{"role": "system", "content": long}, {"role": "user", "content": "One?"}], "max_tokens": 2,
         "temperature": 0}
    reply_texts(d, "/v1/chat/completions", a)
    b = dict(a, messages=[a["messages"][0], {"role": "user", "content": "Two?"}])
    o = d.post("/v1/chat/completions", b)
    cached = o["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    check("prefix: the second prompt reuses the first's rows", cached >= 32, "cached_tokens %d" % cached)


def block_index(share, park=False):
    """A, then B (which takes A's slot: it shares more of A's rows than the empty slot does), then A
    again: A's rows are no slot's any more, and parking is off, so only the index can bring them.
    With parking on too (park), the index brings A's whole blocks and host RAM only the rest."""
    d = Daemon({"parallel": 2, "context": 512, "kv_block_size": 16, "kv_host_mib": 64 if park else 0},
               env=None if share else {"TIDE_KV_SHARE": "0"})
    name = "prefix index and parking" if park else "prefix index" if share else "prefix index off"
    try:
        sysmsg = "Rivers carry the rain from the hills down to the sea, past farms and towns. " * 5
        a = {"messages": [{"role": "system", "content": sysmsg}, {"role": "user", "content": "Why?"}],
             "max_tokens": 24, "temperature": 0}
        b = {"messages": [{"role": "user", "content": "List some colours of the evening sky, please."}],
             "max_tokens": 24, "temperature": 0}
        first = d.post("/v1/chat/completions", a)
        d.post("/v1/chat/completions", b)
        sq = d.vram()["sequences"]
        n_prompt = first["usage"]["prompt_tokens"]
        before = metric(d, "tide_kv_block_cache_tokens_total")
        restored = metric(d, "tide_kv_restored_tokens_total")
        again = d.post("/v1/chat/completions", a)
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        found = metric(d, "tide_kv_block_cache_tokens_total") - before
        same = again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        restored = metric(d, "tide_kv_restored_tokens_total") - restored
        if park:
            check(name + ": A again: its whole blocks from the index, the rest from host RAM",
                  cached == n_prompt - 1 and found >= cached - 16 and 0 <= cached - found - restored < 16,
                  "cached_tokens %d of %d, index %d, restored %d" % (cached, n_prompt, found, restored))
        elif share:
            check(name + ": A's blocks stay cached in the pool after B took its slot", sq["blocks_cached"] >= 8,
                  str({k: sq[k] for k in ("blocks", "blocks_running", "blocks_cached", "blocks_free")}))
            check(name + ": A again finds its whole blocks (cached_tokens, /metrics)",
                  cached >= (n_prompt - 1) // 16 * 16 and found >= cached - 16,
                  "cached_tokens %d of %d, index %d" % (cached, n_prompt, found))
        else:
            check(name + ": A again computes its rows", cached < 16 and found == 0,
                  "cached_tokens %d of %d, index %d" % (cached, n_prompt, found))
        check(name + ": the same reply", same)
    finally:
        d.stop()


def main():
    d = Daemon(dict(POOL, kv_host_mib=64))
    try:
        pool_report(d)
        paused_then_equal(d, "parked")
        hang_ups(d)
        rc = d.stop()
        check("daemon exits 0 on SIGTERM", rc == 0, "rc %d" % rc)
    except BaseException:
        d.stop()
        raise
    d = Daemon(dict(POOL, kv_host_mib=0))
    try:
        paused_then_equal(d, "recomputed")
    finally:
        d.stop()
    block_index(True)
    block_index(False)
    block_index(True, park=True)
    try:
        Daemon(dict(POOL, kv_pool_tokens=128)).stop()
        check("a pool below one context is refused", False, "the daemon started")
    except RuntimeError as e:
        check("a pool below one context is refused, saying why", "kv_pool_tokens" in str(e), str(e)[-200:])
    report()


if __name__ == "__main__":
    main()
