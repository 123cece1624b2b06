#!/usr/bin/env bash
# Install the Debian packages tide builds and tests with. Idempotent: when everything is
# there it only runs dpkg-query and returns.
set -euo pipefail
pkgs=(build-essential pkg-config libmicrohttpd-dev libcjson-dev libstb-dev libcurl4-openssl-dev
      libcriterion-dev libpcre2-dev python3 curl
      nettle-dev   # SHA-256 content keys: src/vision/content_hash.c
      python3-numpy   # tests/model/test_model.py draws the held-out pictures (scripts/train/shapes.py)
      prometheus   # promtool and the server: tests/unit/test_metrics.c, tests/e2e/test_prometheus.sh
      nginx        # tests/e2e/test_deploy.sh runs its own nginx processes (deploy/nginx/tide.conf), never the service
                   # (which Debian starts on install on a host with an init; `systemctl disable --now nginx` if unwanted)
      nodejs       # the official OpenAI Node client: tests/sdk/run.sh
      chromium     # the page at GET / in a browser: tests/browser/run.sh
      xxd          # ui/* compiled into the daemon (Makefile: ui_assets.h)
      clang libclang-rt-14-dev   # make fuzz: libFuzzer, ASan, UBSan runtimes
      valgrind     # make valgrind: the unit tests under memcheck
      python3-jinja2   # tests/jinja/compare.py: our chat-template renderer against the reference
      jq)          # scripts/soak.sh: checks every answer is well-formed JSON
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# npm: Debian splits it from nodejs; some nodejs builds (nodesource) carry it and conflict with it
command -v npm >/dev/null 2>&1 || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
