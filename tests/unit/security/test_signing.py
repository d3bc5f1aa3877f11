"""The controller's signatures and what the agent accepts (core.signing,
node.sinks.request_auth): a message is good for one node and one purpose only, and an
unsigned, foreign, stale or replayed request is never acted on."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpuvigil.core import wire
from gpuvigil.core.signing import BadKey, Signer, Verifier, sig_annotation
from gpuvigil.node.sinks.request_auth import Ledger, Trust, TrustConfig, agent_key
from gpuvigil.platform.clusters.kubernetes import _untagged

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def request(node: str, signer: Signer, *, at: datetime = NOW, rid: str = "r1") -> dict[str, str]:
    text = json.dumps({"id": rid, "action": "REBOOT", "gpus": [], "at": at.isoformat()})
    return {
        wire.REQUEST_ANNOTATION: text,
        sig_annotation(wire.REQUEST_ANNOTATION): signer.sign("remediation-request", node, text),
    }


@pytest.fixture
def ctl(tmp_path):
    s = Signer.generate()
    (tmp_path / "controller.pub").write_bytes(s.public_pem())
    return s


def trust(tmp_path, node: str = "gpu-1", rejected: list | None = None) -> Trust:
    cfg = TrustConfig(controller_public_key_file=tmp_path / "controller.pub")
    return Trust(
        cfg,
        node=node,
        clock=lambda: NOW,
        on_reject=(lambda k, r: rejected.append((k, r))) if rejected is not None else None,
    )


def test_a_signed_fresh_request_for_this_node_is_admitted(tmp_path, ctl):
    assert trust(tmp_path).admit_request(request("gpu-1", ctl)).id == "r1"


def test_what_is_not_the_controllers_own_for_this_node_is_ignored(tmp_path, ctl):
    rejected: list = []
    t = trust(tmp_path, rejected=rejected)
    attacker = Signer.generate()
    unsigned = {wire.REQUEST_ANNOTATION: request("gpu-1", ctl)[wire.REQUEST_ANNOTATION]}
    other_node = request("gpu-2", ctl)  # a genuine request for another node, copied here
    as_release = dict(request("gpu-1", ctl))
    as_release[sig_annotation(wire.REQUEST_ANNOTATION)] = ctl.sign(
        "released-at", "gpu-1", as_release[wire.REQUEST_ANNOTATION]
    )
    tampered = dict(request("gpu-1", ctl))
    tampered[wire.REQUEST_ANNOTATION] = tampered[wire.REQUEST_ANNOTATION].replace("r1", "r2")
    for ann in (
        unsigned,
        other_node,
        as_release,
        tampered,
        request("gpu-1", attacker),
        request("gpu-1", ctl, at=NOW - timedelta(hours=2)),
        request("gpu-1", ctl, at=NOW + timedelta(hours=1)),
    ):
        assert t.admit_request(ann) is None, ann
    assert [r for _, r in rejected] == [
        "not signed",
        "bad signature",
        "bad signature",
        "bad signature",
        "unknown key",
        "too old",
        "from the future",
    ]


def test_no_key_file_means_nothing_is_admitted(tmp_path, ctl):
    (tmp_path / "controller.pub").unlink()
    assert trust(tmp_path).admit_request(request("gpu-1", ctl)) is None
    (tmp_path / "controller.pub").write_bytes(ctl.public_pem())  # appears later: read then
    assert trust(tmp_path).admit_request(request("gpu-1", ctl)) is not None


def test_a_rotation_revokes_the_old_key_at_once(tmp_path, ctl):
    rejected: list = []
    t = trust(tmp_path, rejected=rejected)
    pub = tmp_path / "controller.pub"
    assert t.admit_request(request("gpu-1", ctl)) is not None
    new = Signer.generate()
    pub.write_bytes(new.public_pem())  # the ConfigMap now holds only the new key
    # The old key no longer verifies, though no message signed with the new key came yet.
    assert t.admit_request(request("gpu-1", ctl, rid="r2")) is None
    assert t.admit_request(request("gpu-1", new, rid="r3")) is not None
    # During an overlap both verify; a key deleted from the file stops at the next message.
    pub.write_bytes(new.public_pem() + ctl.public_pem())
    assert t.admit_request(request("gpu-1", ctl, rid="r4")) is not None
    pub.write_bytes(ctl.public_pem())
    assert t.admit_request(request("gpu-1", new, rid="r5")) is None
    pub.unlink()  # no trust set at all: nothing verifies, not even the last key seen
    assert t.admit_request(request("gpu-1", ctl, rid="r6")) is None
    assert [r for _, r in rejected] == ["unknown key", "unknown key", "cannot verify"]


def test_release_times_must_be_signed_too(tmp_path, ctl):
    t = trust(tmp_path)
    at = NOW.isoformat()
    good = {
        wire.RELEASED_ANNOTATION: at,
        sig_annotation(wire.RELEASED_ANNOTATION): ctl.sign("released-at", "gpu-1", at),
    }
    assert t.admit_release(good) == NOW
    assert t.admit_release({wire.RELEASED_ANNOTATION: at}) is None


def test_require_signed_false_trusts_the_node_object(tmp_path, ctl):
    cfg = TrustConfig(require_signed=False, controller_public_key_file=tmp_path / "none")
    t = Trust(cfg, node="gpu-1", clock=lambda: NOW)
    ann = {wire.REQUEST_ANNOTATION: request("gpu-1", ctl)[wire.REQUEST_ANNOTATION]}
    assert t.admit_request(ann) is not None


def test_ledger_survives_a_restart(tmp_path):
    led = Ledger(tmp_path)
    done = wire.RemediationResult(id="r1", result="succeeded", at=NOW)
    led.record(wire.RemediationResult(id="r1", result="started", at=NOW))
    led.record(done)
    assert Ledger(tmp_path).get("r1") == done
    (tmp_path / "remediation-ledger.json").write_text("garbage")
    assert Ledger(tmp_path).get("r1") is None  # unreadable: start empty, never crash
    assert Ledger(None).get("x") is None


def req_at(at: datetime, rid: str = "r") -> wire.RemediationRequest:
    return wire.RemediationRequest(id=rid, action="REBOOT", at=at)


def test_a_lost_ledger_never_runs_a_request_older_than_itself(tmp_path):
    led = Ledger(tmp_path, clock=lambda: NOW)
    led.record(wire.RemediationResult(id="old", result="succeeded", at=NOW))
    later = Ledger(tmp_path, clock=lambda: NOW + timedelta(hours=1))  # a restart: kept
    assert later.since == NOW and later.admits(req_at(NOW - timedelta(minutes=5), "old"))
    assert later.admits(req_at(NOW + timedelta(seconds=1)))
    (tmp_path / "remediation-ledger.json").unlink()  # lost: a new ledger begins now
    lost = Ledger(tmp_path, clock=lambda: NOW + timedelta(minutes=30))
    assert not lost.admits(req_at(NOW + timedelta(minutes=29), "old"))  # may have run
    assert lost.admits(req_at(NOW + timedelta(minutes=31)))
    # Its start is kept at once: a restart before any answer does not move it.
    assert Ledger(tmp_path, clock=lambda: NOW + timedelta(hours=5)).since == lost.since


def test_entries_dropped_for_room_move_the_ledger_start(tmp_path, monkeypatch):
    monkeypatch.setattr("gpuvigil.node.sinks.request_auth.MAX_LEDGER", 2)
    led = Ledger(tmp_path, clock=lambda: NOW - timedelta(hours=1))
    for i in range(3):
        led.record(wire.RemediationResult(id=f"r{i}", result="failed",
                                          at=NOW + timedelta(minutes=i)))  # fmt: skip
    assert led.get("r0") is None and led.since == NOW
    assert not led.admits(req_at(NOW - timedelta(seconds=1), "r0"))


def test_the_agent_key_is_made_once_and_kept_private(tmp_path):
    key = agent_key(tmp_path)
    assert agent_key(tmp_path).kid == key.kid
    assert (tmp_path / "agent-key.pem").stat().st_mode & 0o777 == 0o600
    assert agent_key(None).kid != key.kid
    assert Verifier.from_b64(key.public_b64()).verify("p", "n", "t", key.sign("p", "n", "t")) == ""
    with pytest.raises(BadKey):
        Verifier.from_b64("not a key")


def test_request_ids_carry_an_unguessable_stable_tag():
    a, b = Signer.generate(), Signer.generate()
    rid = "gpu-1.reset_gpu.1764676800"
    assert a.tag(rid) == Signer.from_pem(a.private_pem()).tag(rid)  # stable across restarts
    assert a.tag(rid) != b.tag(rid) and a.tag(rid) != a.tag(rid + "1")
    assert len(a.tag(rid)) == 22 and a.check_tag(rid, a.tag(rid))  # 128 bits
    assert _untagged(f"{rid}.{a.tag(rid)}") == rid
    assert _untagged(rid) == rid and _untagged("x.short") == "x.short"


def test_keys_round_trip_and_bad_keys_are_named():
    s = Signer.generate()
    assert Signer.from_pem(s.private_pem()).kid == s.kid
    both = Verifier.from_pem(s.public_pem() + Signer.generate().public_pem())
    assert len(both.keys) == 2
    with pytest.raises(BadKey):
        Verifier.from_pem(b"hello")
    with pytest.raises(BadKey):
        Signer.from_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
