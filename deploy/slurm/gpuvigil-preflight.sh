#!/bin/bash
# gpuvigil preflight for Slurm: use as Prolog, or as HealthCheckProgram (see docs/preflight.md).
#
#   slurm.conf:  Prolog=/etc/slurm/gpuvigil-preflight.sh
#                PrologFlags=Alloc          # run at allocation, before the job starts
#   or           HealthCheckProgram=/etc/slurm/gpuvigil-preflight.sh
#                HealthCheckInterval=300 HealthCheckNodeState=IDLE
#
# Exit 0: the node passed (and, if this script had drained it, it is resumed). Otherwise
# the node is drained with a reason naming what failed ("gpuvigil preflight: gpu:3 GPU_SDC;
# ...") and the script exits non-zero; as a Prolog, Slurm then requeues the job elsewhere.
# As a HealthCheckProgram on idle nodes (drained ones included), a later pass resumes it.
#
# Settings (environment, e.g. from /etc/default/gpuvigil):
#   GPUVIGIL                 gpuvigil command (default: gpuvigil on PATH)
#   GPUVIGIL_PREFLIGHT_MODE  full (default: every active check, ~2 min on 8 GPUs) or
#                            quick (matmul correctness + memory patterns, ~30 s)
#   GPUVIGIL_CONFIG          config file passed with --config (optional)
#   GPUVIGIL_TIMEOUT_S       hard limit for the whole run (default 240; Slurm's
#                            PrologEpilogTimeout must be larger)
#   GPUVIGIL_BUSY_CHECK      1 (default): when jobs are running on this node (a periodic
#                            health check), run only `gpuvigil check`: active tests would
#                            disturb the jobs and see contended numbers.
set -u

GPUVIGIL=${GPUVIGIL:-gpuvigil}
MODE=${GPUVIGIL_PREFLIGHT_MODE:-full}
TIMEOUT_S=${GPUVIGIL_TIMEOUT_S:-240}
BUSY_CHECK=${GPUVIGIL_BUSY_CHECK:-1}
NODE=${SLURMD_NODENAME:-$(hostname -s)}
CONFIG_ARGS=()
if [ -n "${GPUVIGIL_CONFIG:-}" ]; then
    CONFIG_ARGS=(--config "$GPUVIGIL_CONFIG")
fi

case "$MODE" in
    quick) ARGS=(preflight --checks matmul,memory --budget-s 60) ;;
    full) ARGS=(preflight) ;;
    *) echo "gpuvigil-preflight: unknown GPUVIGIL_PREFLIGHT_MODE=$MODE" >&2; exit 2 ;;
esac

# A periodic health check on a node with running jobs must not start a workload.
if [ "$BUSY_CHECK" = "1" ] && [ -z "${SLURM_JOB_ID:-}" ]; then
    if [ -n "$(squeue --noheader --nodelist="$NODE" --states=RUNNING --format=%i 2>/dev/null)" ]; then
        ARGS=(check)
    fi
fi

# stderr goes to a private temporary file (mktemp: unpredictable name, O_EXCL, mode 0600),
# never to a fixed /tmp path a local user could plant a symlink at.
ERR_FILE=$(mktemp "${TMPDIR:-/tmp}/gpuvigil-preflight.XXXXXXXX") || {
    echo "gpuvigil-preflight: cannot create a temporary file" >&2; exit 2; }
trap 'rm -f "$ERR_FILE"' EXIT
OUT=$(timeout -k 10 "$TIMEOUT_S" "$GPUVIGIL" "${ARGS[@]}" "${CONFIG_ARGS[@]}" --json 2>"$ERR_FILE")
RC=$?
ERR=$(tail -c 300 "$ERR_FILE" 2>/dev/null)

if [ "$RC" -eq 0 ]; then
    # Passed: return the node to service only when this script drained it (its reason
    # starts "gpuvigil preflight:"/"gpuvigil check:"); an admin's or another tool's drain,
    # and the gpuvigil controller's own ("gpuvigil:<state>:..."), are not ours to lift.
    if scontrol show node "$NODE" 2>/dev/null | grep -Eq "Reason=gpuvigil (preflight|check): "; then
        echo "gpuvigil-preflight: $NODE passed; resuming it (it was drained by this script)" >&2
        scontrol update NodeName="$NODE" State=RESUME
    fi
    exit 0
fi

# The reason: the problems' "component CODE" pairs, from the JSON (python3 is on every node
# that runs gpuvigil); a fixed text when the output is not JSON (a crash, a timeout).
SUMMARY=$(printf '%s' "$OUT" | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
r = d.get("report", d)
items = sorted({"%s %s" % (f["component"], f["code"]) for f in r.get("findings", [])
                if f.get("status") != "OK"})
print("; ".join(items)[:200])
' 2>/dev/null)
case "$RC" in
    124|137) WHY="timed out after ${TIMEOUT_S}s" ;;
    1) WHY=${SUMMARY:-"unhealthy"} ;;
    2) WHY="could not run: ${SUMMARY:-$ERR}" ;;
    *) WHY="exit status $RC: ${ERR:-no output}" ;;
esac
REASON="gpuvigil ${ARGS[0]}: ${WHY}"
REASON=${REASON//$'\n'/ }
echo "gpuvigil-preflight: draining $NODE: $REASON" >&2
scontrol update NodeName="$NODE" State=DRAIN Reason="${REASON:0:250}"
exit 1
