"""The remediation messages on the wire (core.wire): one encoder and one decoder each, used
by the controller, the agent and its verifier; garbage decodes to a reason, never raises."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpuvigil.core import wire

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_a_request_and_a_result_round_trip():
    req = wire.RemediationRequest(id="n.reset.x", action="RESET_GPU", gpus=(3, 5), at=NOW)
    assert wire.decode_request(wire.encode_request(req)) == (req, "")
    res = wire.RemediationResult(id=req.id, action="REBOOT", result="started", at=NOW,
                                 boot_id="b1")  # fmt: skip
    assert wire.decode_result(wire.encode_result(res)) == (res, "")
    assert not res.final and res.model_copy(update={"result": "failed"}).final


def test_an_unknown_action_still_decodes_so_the_agent_can_refuse_it():
    text = json.dumps({"id": "r", "action": "FORMAT_DISK", "at": NOW.isoformat()})
    req, why = wire.decode_request(text)
    assert req is not None and req.action == "FORMAT_DISK" and why == ""


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, "no remediation request"),
        ("", "no remediation request"),
        ("{", "Invalid JSON"),
        ("[1, 2]", "should be an object"),
        ('"hello"', "should be an object"),
        ('{"action": "REBOOT", "at": "2026-12-01T12:00:00Z"}', "id: Field required"),
        ('{"id": "", "action": "REBOOT", "at": "2026-12-01T12:00:00Z"}', "id: String should"),
        ('{"id": 7, "action": "REBOOT", "at": "2026-12-01T12:00:00Z"}', "id: Input should"),
        ('{"id": "r", "action": "REBOOT", "at": "2026-12-01T12:00:00"}', "at: Input should have"),
        ('{"id": "r", "action": "REBOOT", "at": "yesterday"}', "at: Input should be"),
        ('{"id": "r", "action": "REBOOT", "gpus": [true], "at": "2026-12-01T12:00:00Z"}',
         "gpus.0: Input should be a valid integer"),
        ('{"id": "r", "action": "REBOOT", "gpus": [-1], "at": "2026-12-01T12:00:00Z"}',
         "gpus.0: Input should be greater"),
        ('{"id": "r", "action": "REBOOT", "gpus": "3", "at": "2026-12-01T12:00:00Z"}', "gpus"),
        ("[" * 100_000, "longer than 4096 bytes"),
        ("\udcff", "remediation request"),
    ],
)  # fmt: skip
def test_garbage_requests_decode_to_a_reason(text, why):
    req, reason = wire.decode_request(text)
    assert req is None and why in reason


def test_garbage_results_decode_to_a_reason():
    for text in ("{}", '{"id": "r", "result": "done", "at": "2026-12-01T12:00:00Z"}', "null",
                 '{"id": "r", "result": "started", "at": 5e400}', "x" * 5000):  # fmt: skip
        res, why = wire.decode_result(text)
        assert res is None and why.startswith("remediation result"), text


def test_the_summary_names_the_gpu_by_uuid_from_the_evidence():
    from gpuvigil.core.findings import Finding, NodeReport, Status
    from gpuvigil.core.wire import decode_health, encode_health

    found = [
        Finding(check="gpu", status=Status.FAILED, code="ROW_REMAP_FAILURE", component="gpu:3",
                evidence={"gpu_uuid": "GPU-3"}),
        Finding(check="xid", status=Status.FAILED, code="XID_48", component="gpu:5",
                evidence={"uuid": "GPU-5"}),
        Finding(check="xid", status=Status.FAILED, code="XID_79", component="pci:0000:3b:00.0",
                evidence={"uuid": None}),
    ]  # fmt: skip
    got = decode_health(encode_health(NodeReport(node="n", findings=tuple(found))))
    assert got is not None
    assert {f.component: f.uuid for f in got.findings} == {
        "gpu:3": "GPU-3", "gpu:5": "GPU-5", "pci:0000:3b:00.0": ""}  # fmt: skip
