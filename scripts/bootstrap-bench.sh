#!/usr/bin/env bash
# Installs what the benchmarks compare against, only when missing: ripgrep (`rg`), the
# second baseline of bench/logscan.py beside GNU grep. For `make bench` only: the tests
# never need it. Idempotent: a machine that has it does nothing (no apt-get update).
set -euo pipefail

command -v rg >/dev/null 2>&1 && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "bootstrap-bench: ripgrep is missing (run as root or install it); bench/logscan.py says so" >&2
  exit 0  # the bench still runs, and prints that ripgrep is absent
fi
echo "bootstrap-bench: installing ripgrep"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends ripgrep >/dev/null
