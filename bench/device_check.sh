#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: run gpuvigil check, preflight and the active-check
# benchmark, and print the figures. Installs nothing: it uses the Python found below
# (which must already have torch with CUDA) and this checkout's src/ on PYTHONPATH.
# Output goes to stdout and, when $OUT is set, into files under $OUT.
#
#   bench/device_check.sh                   # PYTHON=/path/to/python to choose one
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-}
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    for cand in .venv/bin/python python3 python; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import torch' 2>/dev/null; then
            PY=$cand; break
        fi
    done
fi
if [ -z "$PY" ]; then
    echo "device_check: no Python with torch found (set PYTHON=...)" >&2
    exit 3
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
save() { if [ -n "$OUT" ]; then cat > "$OUT/$1"; else cat > /dev/null; fi; }

echo "== machine"
nvidia-smi -L 2>&1 | head -16
"$PY" - <<'PY' 2>&1 | tee >(save env.txt)
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
missing = []
for m in ("pydantic", "typer", "rich", "yaml", "pynvml", "prometheus_client"):
    try:
        __import__(m)
    except ImportError:
        missing.append(m)
print("missing python modules:", ", ".join(missing) or "none")
PY

echo "== gpuvigil check --json"
START=$(date +%s.%N)
timeout -k 5 120 "$PY" -m gpuvigil check --json > /tmp/gv_check.json 2> /tmp/gv_check.err
RC=$?; echo "exit $RC in $(awk "BEGIN{print $(date +%s.%N) - $START}") s"
save check.json < /tmp/gv_check.json
head -c 3000 /tmp/gv_check.json; tail -c 1000 /tmp/gv_check.err

echo "== gpuvigil preflight --json"
START=$(date +%s.%N)
timeout -k 5 300 "$PY" -m gpuvigil preflight --json > /tmp/gv_preflight.json 2> /tmp/gv_preflight.err
RC=$?; echo "exit $RC in $(awk "BEGIN{print $(date +%s.%N) - $START}") s"
save preflight.json < /tmp/gv_preflight.json
"$PY" - <<'PY'
import json
try:
    d = json.load(open("/tmp/gv_preflight.json"))
except ValueError:
    print(open("/tmp/gv_preflight.err").read()[-2000:]); raise SystemExit
print("result", d["result"], "duration_s", d["duration_s"], "budget_s", d["budget_s"])
print("check durations", d["check_durations_s"])
for m in d["measurements"]:
    print(f"  {m['check']:9} {m['component']:7} {m['metric']:16} achieved {m['achieved']} "
          f"expected {m['expected']} {m['unit']} {m['status']} {m['code'] or ''}")
for f in d["report"]["findings"]:
    if f["status"] != "OK":
        print(f"  problem {f['check']} {f['component']} {f['code']}: {f['message'][:160]}")
PY
tail -c 1000 /tmp/gv_preflight.err

echo "== bench/active.py --device cuda --skip-preflight"
timeout -k 5 300 "$PY" bench/active.py --device cuda --skip-preflight --rounds 1 \
    | tee >(save bench_active.txt)
