#!/usr/bin/python3
"""check_docs.py - the reference tables of docs/ against the code they describe.

"Keep docs/ true to what you build": a config key, flag, metric family or environment switch
added to the code without its row (or a row left behind by one that is gone) is what goes stale
first, so this reads the names from the sources and the tables and fails on any difference:
  - every key src/server/config.c reads has a row in docs/CONFIG.md's key table (nested keys as
    `vision.idle_s`; a device entry's fields inside the `devices` row), and every row a key;
  - every flag of src/server/cli.c's table is in docs/CONFIG.md's flag table, and every row a flag;
  - every metric family src/server/metrics.c renders has a row in docs/METRICS.md, and every row
    a family;
  - every getenv("TIDE_...") under src/ is in docs/CONFIG.md or docs/SECURITY.md.
Run from the repository root: python3 tests/docs/check_docs.py (no build needed)."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def config_keys():
    """Keys config.c compares against, prefixed by the object they live in."""
    keys, prefix = set(), ""
    for line in read("src/server/config.c").splitlines():
        m = re.match(r"static int parse_(\w+)\(", line)
        if m:
            prefix = {"vision": "vision.", "http": "http.", "devices": "devices[]."}.get(m.group(1), "")
        for var, name in re.findall(r'strcmp\((\w+)(?:->string)?, "([a-z_]+)"\)', line):
            if var == "x":  # the expert_cache object's loop in parse_root
                keys.add("expert_cache." + name)
            elif var in ("k", "f"):
                keys.add(prefix + name)
    return keys


def doc_rows(text, pattern):
    return set(re.findall(pattern, text, re.M))


def main():
    errors = []
    config_md = read("docs/CONFIG.md")
    code = config_keys()
    rows = doc_rows(config_md, r"^\| `([a-z_.]+)` \|")
    listed = re.findall(r"^\| `([a-z_.]+)` \|", config_md, re.M)
    for k in sorted({k for k in listed if listed.count(k) > 1}):
        errors.append("CONFIG.md: %d rows for config key %s (one is enough; they may disagree)" % (listed.count(k), k))
    for k in sorted(code):
        if k.startswith("devices[]."):
            # documented inside the devices row: {"backend":..., "index":N, "vram_mib":M}
            row = next((l for l in config_md.splitlines() if l.startswith("| `devices` |")), "")
            if '"%s"' % k.split(".", 1)[1] not in row:
                errors.append("CONFIG.md: the devices row does not name field %s (config.c reads it)" % k)
        elif k not in rows and not any(r.startswith(k + ".") for r in rows):  # an object: its keys' rows
            errors.append("CONFIG.md: no row for config key %s (config.c reads it)" % k)
    for k in sorted(rows - code):
        errors.append("CONFIG.md: row for %s, a key config.c does not read" % k)

    cli = read("src/server/cli.c")
    flags = set()
    for long_flag, short in re.findall(r'\{ "(--[a-z-]+)", (NULL|"-[a-z]+"),', cli):
        flags.add(long_flag)
        if short != "NULL":
            flags.add(short.strip('"'))
    flag_rows = set()
    for cell in re.findall(r"^\| (`-[^|]*?)\|", config_md, re.M):
        flag_rows.update(re.findall(r"`(-{1,2}[a-z-]+)", cell))
    for f in sorted(flags - flag_rows):
        errors.append("CONFIG.md: flag %s (cli.c) is not in the flag table" % f)
    for f in sorted(flag_rows - flags):
        errors.append("CONFIG.md: flag %s in the flag table is not in cli.c" % f)

    families = set(re.findall(r'"(tide_[a-z0-9_]+)', read("src/server/metrics.c")))
    metric_rows = doc_rows(read("docs/METRICS.md"), r"^\| `(tide_[a-z0-9_]+)` \|")
    for m in sorted(families - metric_rows):
        errors.append("METRICS.md: no row for metric family %s (metrics.c renders it)" % m)
    for m in sorted(metric_rows - families):
        errors.append("METRICS.md: row for %s, a family metrics.c does not render" % m)

    env_docs = config_md + read("docs/SECURITY.md")
    for dirpath, _, files in os.walk(os.path.join(ROOT, "src")):
        for name in files:
            if not name.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                for var in re.findall(r'getenv\("(TIDE_[A-Z0-9_]+)"\)', f.read()):
                    if "`" + var not in env_docs:
                        errors.append("CONFIG.md/SECURITY.md: environment switch %s (%s) is not documented"
                                      % (var, name))

    for e in errors:
        print("check_docs: " + e)
    if errors:
        return 1
    print("check_docs: %d config keys, %d flags, %d metric families: every one documented, no row left over"
          % (len(code), len(flags), len(families)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
