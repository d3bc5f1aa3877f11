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
  never run again, even when someone erased the result annotation to replay the request;
  the agent decides from it alone, never from the result on the Node (anyone who can
  write the Node can plant one). A request older than the ledger itself is never run.
- `agent_key`: the agent's own key (`<state_dir>/agent-key.pem`), which signs its results.

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
from gpuvigil.core.signing import BadKey, Signer, Verifier, sig_annotation

log = logging.getLogger("gpuvigil.agent.trust")
LEDGER_FILE = "remediation-ledger.json"
MAX_LEDGER = 256


def _now() -> datetime:
    return datetime.now(UTC)


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
        clock: Callable[[], datetime] = _now,
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

    def reject(self, kind: str, text: str, why: str, sig: str | None) -> None:
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
        why = self._verify(wire.REQUEST_PURPOSE, text, sig)
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
            self.reject("remediation-request", text, why, sig)
            return None
        return req

    def admit_release(self, annotations: dict[str, str]) -> datetime | None:
        text = annotations.get(wire.RELEASED_ANNOTATION)
        if not text:
            return None
        sig = annotations.get(sig_annotation(wire.RELEASED_ANNOTATION))
        why = self._verify("released-at", text, sig)
        if why:
            self.reject("released-at", text, why, sig)
            return None
        return wire.decode_time(text)


class Ledger:
    """The answers this agent gave, by request id; kept across restarts in `state_dir`.

    Only this node's root can write the file (0640 in a root-owned folder), so it, not the
    result annotation on the Node (which other accounts can write), is what the agent acts
    on. `since`: when this ledger began. A request issued before it that it does not hold
    may have been answered by a ledger since lost, so it is never run (`admits`); entries
    dropped for room move `since` forward the same way."""

    def __init__(self, state_dir: Path | None, *, clock: Callable[[], datetime] = _now) -> None:
        self.path = state_dir / LEDGER_FILE if state_dir is not None else None
        self._lock = threading.Lock()
        self._answers: dict[str, wire.RemediationResult] = {}
        self.since = clock()
        doc = self._read()
        if doc is None:
            self._save()  # a new ledger: its start is kept, so a restart does not move it
            return
        answers = doc.get("answers") if "v" in doc else doc  # v1: the answers alone
        since = wire.decode_time(str(doc.get("since") or ""))
        if since is not None:
            self.since = since
        for k, v in (answers if isinstance(answers, dict) else {}).items():
            try:
                self._answers[k] = wire.RemediationResult.model_validate(v)
            except ValidationError:
                log.warning("ledger %s: entry %.80s unreadable; dropped", self.path, k)

    def _read(self) -> dict | None:
        if self.path is None:
            return None
        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ledger %s unreadable (%s): starting a new one", self.path, e)
            return None
        return doc if isinstance(doc, dict) else None

    def get(self, request_id: str) -> wire.RemediationResult | None:
        with self._lock:
            return self._answers.get(request_id)

    def admits(self, req: wire.RemediationRequest) -> bool:
        """A request this ledger has, or one issued since it began (so it would have it)."""
        with self._lock:
            return req.id in self._answers or req.at >= self.since

    def record(self, result: wire.RemediationResult) -> None:
        """Kept before the answer is written anywhere else (`started` before acting)."""
        with self._lock:
            self._answers[result.id] = result
            while len(self._answers) > MAX_LEDGER:
                dropped = self._answers.pop(next(iter(self._answers)))
                self.since = max(self.since, dropped.at)
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        doc = {
            "v": 2,
            "since": self.since.isoformat(),
            "answers": {k: v.model_dump(mode="json") for k, v in self._answers.items()},
        }
        try:
            write_atomic(self.path, json.dumps(doc).encode())
        except OSError as e:
            if self._answers:
                raise  # an answer not kept must not be acted on: the sink retries
            log.warning("ledger %s cannot be written: %s", self.path, e)


AGENT_KEY_FILE = "agent-key.pem"


def agent_key(state_dir: Path | None) -> Signer:
    """This agent's own signing key (results), made on its first start, kept in
    `state_dir` (0600); without a state dir, one per process."""
    if state_dir is None:
        return Signer.generate()
    path = state_dir / AGENT_KEY_FILE
    try:
        return Signer.from_pem(path.read_bytes())
    except FileNotFoundError:
        pass
    except (OSError, BadKey) as e:
        log.warning("agent key %s unusable (%s): making a new one", path, e)
    key = Signer.generate()
    try:
        write_atomic(path, key.private_pem(), mode=0o600)
    except OSError as e:
        log.warning("agent key %s cannot be kept (%s): one for this process only", path, e)
    return key
