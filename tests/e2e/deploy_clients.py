#!/usr/bin/env python3
"""deploy_clients.py - the clients of tests/e2e/test_deploy.sh.

  load URL SECONDS CLIENTS OUT   CLIENTS threads stream chat completions through URL for SECONDS;
                                 one JSON line per request to OUT: start/end (time.time()), ok,
                                 status, instance (X-Tide-Instance) and the error if any. A request
                                 is ok when it answers 200, streams at least one chunk, carries no
                                 error event and ends with `data: [DONE]`.
  affinity URL SESSIONS          SESSIONS two-turn conversations with X-Session-Id; prints one line
                                 `session instance1 instance2` each.
"""
import http.client
import json
import sys
import threading
import time
import urllib.parse


def chat(url, messages, stream, session=None, max_tokens=32, timeout=60):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": stream})
    headers = {"Content-Type": "application/json"}
    if session:
        headers["X-Session-Id"] = session
    rec = {"start": time.time(), "ok": False, "status": None, "instance": None, "error": None, "text": ""}
    try:
        conn.request("POST", "/v1/chat/completions", body, headers)
        r = conn.getresponse()
        rec["status"] = r.status
        rec["instance"] = r.getheader("X-Tide-Instance")
        data = r.read().decode("utf-8", "replace")
        if r.status != 200:
            rec["error"] = "HTTP %d: %s" % (r.status, data[:200])
        elif not stream:
            rec["text"] = json.loads(data)["choices"][0]["message"]["content"]
            rec["ok"] = True
        else:
            events = [l[6:] for l in data.split("\n") if l.startswith("data: ")]
            chunks = [json.loads(e) for e in events if e != "[DONE]"]
            errors = [c for c in chunks if "error" in c]
            if errors:
                rec["error"] = "error event: %s" % json.dumps(errors[0])[:200]
            elif not events or events[-1] != "[DONE]":
                rec["error"] = "stream ended without [DONE] after %d events" % len(events)
            elif not chunks:
                rec["error"] = "no chunks"
            else:
                rec["text"] = "".join((c["choices"][0].get("delta") or {}).get("content") or ""
                                      for c in chunks if c.get("choices"))
                rec["ok"] = True
    except Exception as e:  # a cut stream (IncompleteRead), a refused or reset connection
        rec["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        conn.close()
    rec["end"] = time.time()
    return rec


def load(url, seconds, clients, out):
    stop_at = time.time() + seconds
    lock = threading.Lock()
    recs = []

    def client(k):
        n = 0
        while time.time() < stop_at:
            rec = chat(url, [{"role": "user", "content": "Hello there, client %d turn %d" % (k, n)}], True)
            rec.pop("text")
            with lock:
                recs.append(rec)
            n += 1
            if not rec["ok"]:
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(out, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def affinity(url, sessions):
    for s in range(sessions):
        sid = "conversation-%d" % s
        msgs = [{"role": "user", "content": "Hello, this is conversation %d" % s}]
        r1 = chat(url, msgs, False, sid, max_tokens=8)
        if not r1["ok"]:
            print("%s FAIL %s" % (sid, r1["error"]))
            continue
        msgs += [{"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "And then?"}]
        r2 = chat(url, msgs, False, sid, max_tokens=8)
        print("%s %s %s" % (sid, r1["instance"], r2["instance"] if r2["ok"] else "FAIL:" + str(r2["error"])))


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif sys.argv[1] == "affinity":
        affinity(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: deploy_clients.py load URL SECONDS CLIENTS OUT | affinity URL SESSIONS")
