"""A failed pod's timeline line says why it failed: the last line of its termination
message (the example trainer falls back to its log's tail), so a failure that no fault
caused explains itself in the lab's output."""

from __future__ import annotations

from typing import Any

from gpuvigil.lab.jobs import failure_message


def _pod(message: Any) -> dict[str, Any]:
    term = {"exitCode": 1} if message is None else {"exitCode": 1, "message": message}
    return {"status": {"containerStatuses": [{"state": {"terminated": term}}]}}


def test_the_last_line_of_the_message_is_the_reason() -> None:
    tail = "Traceback ...\n  File x\nRuntimeError: The server socket has failed to listen\n\n"
    assert failure_message(_pod(tail)) == "RuntimeError: The server socket has failed to listen"


def test_no_message_or_garbage_gives_nothing_and_never_raises() -> None:
    for pod in (_pod(None), _pod(""), _pod("  \n\n"), {}, {"status": None}, {"status": {}}):
        assert failure_message(pod) == ""
    assert len(failure_message(_pod("x" * 5000))) == 200


def test_the_example_job_keeps_its_log_tail_as_the_message() -> None:
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[3]
    docs = list(
        yaml.safe_load_all((root / "deploy/kubernetes/examples/training-job.yaml").read_text())
    )
    (job,) = [d for d in docs if d and d.get("kind") == "Job"]
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
