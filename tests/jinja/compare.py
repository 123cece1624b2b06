#!/usr/bin/python3
"""Render every tests/jinja/NAME.jinja with each NAME.json / NAME.*.json by tide
(build/tide-jinja) and by python3-jinja2 with Hugging Face's apply_chat_template settings,
and compare byte for byte. A case where jinja2 raises must fail in tide too.

usage: compare.py TIDE_JINJA [DIR ...]   (DIR defaults to this script's folder)
"""
import glob
import json
import os
import subprocess
import sys
import time

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1721995200  # 26 Jul 2024 12:00 UTC: strftime_now sees this on both sides


def hf_env():
    # transformers' _compile_jinja_template: these settings, these globals, this tojson
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return time.strftime(fmt, time.localtime(NOW))

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    tide = sys.argv[1]
    dirs = sys.argv[2:] or [os.path.dirname(os.path.abspath(__file__))]
    os.environ["TZ"] = "UTC"
    time.tzset()
    env = hf_env()
    fails = cases = 0
    for d in dirs:
        for tpl in sorted(glob.glob(os.path.join(d, "*.jinja"))):
            stem = tpl[:-len(".jinja")]
            datas = sorted(glob.glob(stem + ".json") + glob.glob(stem + ".*.json"))
            if not datas:
                fails += 1
                print("FAIL %s: no %s.json data file" % (os.path.basename(tpl), os.path.basename(stem)))
            src = open(tpl, encoding="utf-8").read()
            for data in datas:
                cases += 1
                name = os.path.basename(tpl) + " + " + os.path.basename(data)
                ctx = json.load(open(data, encoding="utf-8"))
                try:
                    want = env.from_string(src).render(**ctx).encode("utf-8")
                    want_err = None
                except Exception as e:  # noqa: BLE001 - any jinja2 failure is an expected error
                    want, want_err = None, "%s: %s" % (type(e).__name__, e)
                p = subprocess.run([tide, tpl, data], capture_output=True,
                                   env=dict(os.environ, TIDE_JINJA_NOW=str(NOW)), timeout=60)
                if want_err is not None:
                    if p.returncode == 0:
                        fails += 1
                        print("FAIL %s: jinja2 raised (%s) but tide rendered" % (name, want_err))
                    continue
                if p.returncode != 0:
                    fails += 1
                    print("FAIL %s: tide failed: %s" % (name, p.stderr.decode(errors="replace").strip()))
                elif p.stdout != want:
                    fails += 1
                    at = next((i for i in range(min(len(want), len(p.stdout))) if want[i] != p.stdout[i]),
                              min(len(want), len(p.stdout)))
                    print("FAIL %s: differs at byte %d\n  jinja2: %r\n  tide:   %r"
                          % (name, at, want[max(0, at - 60):at + 60], p.stdout[max(0, at - 60):at + 60]))
    print("jinja compare: %d of %d cases equal to python3-jinja2 %s" % (cases - fails, cases, jinja2.__version__))
    return 1 if fails or not cases else 0


if __name__ == "__main__":
    sys.exit(main())
