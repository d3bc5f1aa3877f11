"""The lab reads the API server's audit log for what it refused gpuvigil's identities."""

from __future__ import annotations

import json
from pathlib import Path

from gpuvigil.lab.control_plane import refused, sa_user


def event(user: str, verb: str, code: int, **ref: str) -> str:
    return json.dumps({"kind": "Event", "verb": verb, "user": {"username": user},
                       "objectRef": ref, "responseStatus": {"code": code}})  # fmt: skip


def test_refusals_per_user_distinct_with_subresource_and_namespace(tmp_path: Path) -> None:
    ctl = sa_user("gpuvigil:gpuvigil-controller")
    log = tmp_path / "audit.log"
    log.write_text("\n".join([
        event(ctl, "watch", 403, resource="nodes"),
        event(ctl, "watch", 403, resource="nodes"),  # the same request again: once
        event(ctl, "get", 200, resource="nodes"),  # allowed: not listed
        event("system:node:a", "patch", 403, resource="nodes", subresource="status"),
        event(ctl, "create", 403, resource="pods", namespace="gpuvigil"),
        "not json {",  # a torn last line while the server writes
        json.dumps({"verb": "get"}),  # no status: not a refusal
        json.dumps({"responseStatus": {"code": 403}}),  # no user: skipped, never raises
    ]))  # fmt: skip
    assert ctl == "system:serviceaccount:gpuvigil:gpuvigil-controller"
    assert refused(log) == {
        ctl: ["create pods in gpuvigil", "watch nodes"],
        "system:node:a": ["patch nodes/status"],
    }


def test_no_log_yet_is_no_refusal(tmp_path: Path) -> None:
    assert refused(tmp_path / "absent.log") == {}
