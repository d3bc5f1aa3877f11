"""`gpuvigil slurm-healthcheck` never passes a node on an agent report it cannot use: a
missing, unreadable or stale state file is a FAILED RESULT_STALE finding (exit non-zero),
whatever the checks it runs itself find; `--no-agent` (no agent on this node) judges by
those checks alone."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuvigil.core.files import write_atomic
from gpuvigil.core.findings import NodeReport, utcnow


@pytest.mark.parametrize("kind", ["missing", "unreadable", "stale"])
def test_an_unusable_agent_report_fails(run_cli, tmp_path, kind) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "report.json"
    if kind == "unreadable":
        state.write_text('{"node": "n1", "findings": [')  # a torn or garbage file
    elif kind == "stale":
        old = NodeReport(node="n1", generated_at=utcnow() - timedelta(hours=1))
        write_atomic(state, old.model_dump_json().encode())
    args = ["slurm-healthcheck", "--node-name", "n1", "--no-drain", "--state-file", str(state),
            "--expect-gpus", "0", "--sysfs-root", str(tmp_path)]  # fmt: skip
    r = run_cli(*args, timeout=120)
    assert r.returncode != 0, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "RESULT_STALE agent" in ln)
    assert line.startswith("FAILED") and kind in line, line
    alone = run_cli(*args, "--no-agent", timeout=120)
    assert "RESULT_STALE agent" not in alone.stdout, alone.stdout
