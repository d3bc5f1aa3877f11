"""Which of the controller's messages on this Node the agent believes, and what it did.

Called by the Kubernetes sink before anything it reads from its Node is acted on:

- `Trust.admit_request`: a remediation request is acted on only when it carries the
  controller's signature for this node (`core.signing`), is no older than
  `request_max_age_s` and not from the future. Anything else is ignored: not run, not
  answered (an answer would hide the controller's real request), counted in
  `gpuvigil_agent_rejected_messages_total{kind,reason}` and logged.
- `Trust.admit_release`: the `released-at` time (forget REPLACE/INVESTIGATE Xids) likewise.
- `Ledger`: every answer the agent gave, by request id, in `<state_dir>/remediation-ledger
  .json` (0640, `core.files`). A request already answered is answered again from here,
  never run again, even when someone erased the result annotation to replay the request.

Separate from `remediation` (which runs the commands) so either can change alone.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import Field, ValidationError

from gpuvigil.core import wire
from gpuvigil.core.config import StrictModel
from gpuvigil.core.files import write_atomic
from gpuvigil.core.signing import BadKey, Verifier, sig_annotation

log = logging.getLogger("gpuvigil.agent.trust")
LEDGER_FILE = "remediation-ledger.json"
MAX_LEDGER = 256


class TrustConfig(StrictModel):
    require_signed: bool = Field(
        True,
        description="Act only on requests and releases signed by the controller. False trusts "
        "whoever can write this Node: only where nothing but the controller can (the "
        "ValidatingAdmissionPolicy of deploy/kubernetes/admission on 1.30+, a lab).",
    )
    controller_public_key_file: Path = Field(
        Path("/etc/gpuvigil/trust/controller.pub"),
        description="The controller's Ed25519 public key(s), PEM. The controller publishes it "
        "in the ConfigMap gpuvigil-trust, which the DaemonSet mounts here. Read for every "
        "message, never cached: a key no longer in the file no longer verifies.",
    )
    request_max_age_s: float = Field(
        3600.0,
        gt=0,
        description="A request older than this is ignored: the controller gives up on a step "
        "after at most reboot_timeout_s (30 min), so an older one can only be a replay.",
    )


class Trust:
    def __init__(
        self,
        config: TrustConfig,
        *,
        node: str,
        on_reject: Callable[[str, str], None] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.config, self.node, self.clock = config, node, clock
        self._on_reject = on_reject
        self._said: set[tuple[str, str]] = set()

    def _verify(self, purpose: str, text: str | None, sig: str | None) -> str:
        """The trusted keys are read again for every message, never cached: the key file is
        the trust ConfigMap as mounted, so a key removed from it (a rotation, a revocation)
        stops verifying at the next poll after the kubelet updates the file."""
        if not self.config.require_signed:
            return ""
        try:
            verifier = Verifier.from_file(self.config.controller_public_key_file)
        except BadKey as e:
            return f"cannot verify: {e}"
        return verifier.verify(purpose, self.node, text, sig)

    def _reject(self, kind: str, text: str, why: str, sig: str | None) -> None:
        """Counted and logged once per message: a request stays on the Node after it was
        answered (and then ages past the limit), and is read again on every publish."""
        key = (kind, f"{text}\0{sig or ''}")
        if key in self._said:
            return
        if len(self._said) > 1000:
            self._said.clear()
        self._said.add(key)
        if self._on_reject:
            reason = "unknown key" if why.startswith("signed with unknown key") else why
            self._on_reject(kind, reason.split(":", maxsplit=1)[0])
        log.warning("ignoring %s on node %s: %s: %.200s", kind, self.node, why, text)

    def admit_request(self, annotations: dict[str, str]) -> wire.RemediationRequest | None:
        text = annotations.get(wire.REQUEST_ANNOTATION)
        if not text:
            return None
        sig = annotations.get(sig_annotation(wire.REQUEST_ANNOTATION))
        why = self._verify("remediation-request", text, sig)
        req, unreadable = wire.decode_request(text)
        if not why and req is None:
            why = f"unreadable: {unreadable}"
        if not why and req is not None:
            at, now = req.at, self.clock()
            if at > now + timedelta(minutes=5):
                why = "from the future"
            elif (now - at).total_seconds() > self.config.request_max_age_s:
                why = "too old"
        if why:
            self._reject("remediation-request", text, why, sig)
            return None
        return req

    def admit_release(self, annotations: dict[str, str]) -> datetime | None:
        text = annotations.get(wire.RELEASED_ANNOTATION)
        if not text:
            return None
        sig = annotations.get(sig_annotation(wire.RELEASED_ANNOTATION))
        why = self._verify("released-at", text, sig)
        if why:
            self._reject("released-at", text, why, sig)
            return None
        return wire.decode_time(text)


class Ledger:
    """The answers this agent gave, by request id; kept across restarts in `state_dir`."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = state_dir / LEDGER_FILE if state_dir is not None else None
        self._lock = threading.Lock()
        self._answers: dict[str, wire.RemediationResult] = {}
        if self.path is not None:
            try:
                doc = json.loads(self.path.read_bytes())
            except (OSError, ValueError):
                doc = None  # absent or unreadable: start empty
            if isinstance(doc, dict):
                for k, v in doc.items():
                    try:
                        self._answers[k] = wire.RemediationResult.model_validate(v)
                    except ValidationError:
                        log.warning("ledger %s: entry %.80s unreadable; dropped", self.path, k)

    def get(self, request_id: str) -> wire.RemediationResult | None:
        with self._lock:
            return self._answers.get(request_id)

    def record(self, result: wire.RemediationResult) -> None:
        """Kept before the answer is written anywhere else (`started` before acting)."""
        with self._lock:
            self._answers[result.id] = result
            while len(self._answers) > MAX_LEDGER:
                self._answers.pop(next(iter(self._answers)))
            if self.path is not None:
                doc = {k: v.model_dump(mode="json") for k, v in self._answers.items()}
                write_atomic(self.path, json.dumps(doc).encode())
