#!/usr/bin/env python3
"""ncu-summary.py - kernels by total time from an `ncu --print-summary per-kernel` log.

Reads the log ncu writes with `--metrics gpu__time_duration.sum --print-summary per-kernel`
(scripts/prof-gpu-step.sh makes one) and prints each kernel and launch shape with its
invocations, mean and total time and share of the total, most first.
Usage: scripts/ncu-summary.py LOG [N]   (N rows, default 30)"""
import re
import sys

HEAD = re.compile(r"^\s{2}(\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Device \d+, CC [\d.]+, Invocations (\d+)")
UNIT = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def rows(lines):
    cur = None
    for line in lines:
        m = HEAD.match(line)
        if m:
            name = m.group(1).split("(")[0].strip()
            cur = (name, "(%s,%s,%s)x(%s,%s,%s)" % m.group(2, 3, 4, 5, 6, 7), int(m.group(8)))
            continue
        if cur and "gpu__time_duration.sum" in line:
            p = line.split()
            i = p.index("gpu__time_duration.sum")
            unit, avg = p[i + 1], float(p[i + 4].replace(",", ""))  # name unit min max avg
            mean = avg * UNIT.get(unit, 1.0)
            yield cur[0], cur[1], cur[2], mean, mean * cur[2]
            cur = None


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    rs = sorted(rows(open(sys.argv[1], errors="replace")), key=lambda r: -r[4])
    total = sum(r[4] for r in rs) or 1.0
    print("%-56s %-26s %7s %10s %10s %6s" % ("kernel", "grid x block", "calls", "mean us", "total ms", "share"))
    for name, shape, calls, mean, tot in rs[:n]:
        print("%-56s %-26s %7d %10.2f %10.2f %5.1f%%" % (name[:56], shape, calls, mean, tot / 1e3, 100 * tot / total))
    print("%d kernels, %.2f ms in all" % (len(rs), total / 1e3))


if __name__ == "__main__":
    main()
