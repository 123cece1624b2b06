#!/usr/bin/env python3
"""bench-cpu-time.py - prefill in tokens per CPU-second, tide (through its HTTP API) against
llama-bench, at 1 thread: for a machine whose other tenants make wall-clock rates swing (issue
26). A process's CPU time does not count the time it waited for a core, so on a busy machine
it measures the engine rather than the neighbours (not cache sharing, and not a second thread:
at 2 threads both engines spin while they wait, so only 1 thread is compared this way).

  tide:  the daemon (-t 1) gets a warm-up request, then REPS random PROMPT-token prompts with
         max_tokens 1; each one's CPU time is the daemon's utime + stime (/proc/PID/stat)
         across the request (one decode step and the HTTP handling included);
  llama: llama-bench -t 1 -p PROMPT -n 0 --no-warmup, run with -r 1 and with -r REPS+1; the
         difference of the two runs' CPU time (children's rusage) is REPS prefills, the model
         load and first touch cancelling out.
Sides alternate RUNS times. Prints one line a run and side: side=... tokcpu=<tok per CPU-s>.
Usage: bench-cpu-time.py TIDE_BIN LLAMA_BENCH MODEL [RUNS=3] [REPS=3] [PROMPT=512] [PORT=18393]
"""
import json
import os
import random
import resource
import subprocess
import sys
import time
import urllib.request

tide, lb, model = sys.argv[1], sys.argv[2], sys.argv[3]
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
prompt = int(sys.argv[6]) if len(sys.argv) > 6 else 512
port = int(sys.argv[7]) if len(sys.argv) > 7 else 18393
url = "http://127.0.0.1:%d" % port
tick = os.sysconf("SC_CLK_TCK")
rng = random.Random()


def proc_cpu(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick  # utime, stime


def request(n, max_tokens):
    body = {"prompt": [rng.randrange(3, 771) for _ in range(n)], "max_tokens": max_tokens, "temperature": 0}
    r = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    urllib.request.urlopen(r, timeout=900).read()


def tide_side():
    p = subprocess.Popen([tide, "-m", model, "-t", "1", "-c", "2048", "-np", "1", "--port", str(port),
                          "--host", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except Exception:
                time.sleep(0.2)
        request(64, 8)
        rates = []
        for _ in range(reps):
            c0 = proc_cpu(p.pid)
            request(prompt, 1)
            rates.append(prompt / (proc_cpu(p.pid) - c0))
        return rates
    finally:
        p.terminate()
        p.wait()


def children_cpu():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def llama_side():
    def run(r):
        c0 = children_cpu()
        subprocess.run([lb, "-m", model, "-t", "1", "-p", str(prompt), "-n", "0", "--no-warmup", "-r", str(r)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        return children_cpu() - c0
    one, many = run(1), run(reps + 1)
    return [reps * prompt / (many - one)]


for run in range(1, runs + 1):
    for side, fn in (("tide", tide_side), ("llama", llama_side)):
        load = open("/proc/loadavg").read().split()[0]
        rates = fn()
        print("run=%d side=%s load=%s tokcpu=%s" % (run, side, load, ",".join("%.0f" % r for r in rates)),
              flush=True)
