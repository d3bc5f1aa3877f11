"""Which key each node's agent signs its remediation results with, as the controller pinned
it. Called by `clusters.kubernetes`: `pin` when it first writes to a Node (its state record
or a request), `verifier` when it reads a result, `forget` when it deletes the Node.

An agent makes its key on its first start (`node.sinks.request_auth.agent_key`) and
publishes the public half in `core.wire.AGENT_KEY_ANNOTATION`. Anyone who can write a Node
can write that annotation too, so the controller keeps its own copy, pinned on first use
(before it asks anything of the node), in the trust ConfigMap (`agent-key.<node>` =
`<Node uid> <key>`), which only the controller's account may change. A result counts only
when it verifies with the pinned key; a later, different key on the same Node object is
never taken (a wiped state dir, or someone else): that node's requests time out and
escalate until a person removes the pin. A new Node object (a new uid: the node was
deleted and joined again) is pinned afresh.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from gpuvigil.core.signing import BadKey, Verifier
from gpuvigil.platform.clusters.base import ClusterError, Conflict, NotFound
from gpuvigil.platform.clusters.k8s_api import api_call

log = logging.getLogger("gpuvigil.clusters.kubernetes")
PREFIX = "agent-key."
RELOAD_S = 10.0  # a pin another replica made is seen within this
T = TypeVar("T")
Write = Callable[[str, Callable[[float], T]], T]


class AgentPins:
    def __init__(self, core: Any, settings: Any, write: Write) -> None:
        self.core, self.settings, self._write = core, settings, write
        self.ns, self.name = settings.key_namespace, settings.trust_configmap
        self._pins: dict[str, tuple[str, str]] | None = None  # node -> (uid, key)
        self._loaded = 0.0
        self._lock = threading.Lock()
        self._warned: set[tuple[str, str]] = set()

    def _read(self) -> tuple[dict[str, Any] | None, dict[str, tuple[str, str]]]:
        try:
            resp = api_call(
                lambda: self.core.read_namespaced_config_map(
                    self.name, self.ns, _preload_content=False,
                    _request_timeout=self.settings.request_timeout_s,
                )
            )  # fmt: skip
        except NotFound:
            return None, {}
        cm = json.loads(resp.data)
        pins = {}
        for k, v in (cm.get("data") or {}).items():
            uid, _, key = str(v).partition(" ")
            if k.startswith(PREFIX) and uid and key:
                pins[k[len(PREFIX) :]] = (uid, key)
        return cm, pins

    def _current(self, *, refresh: bool = False) -> dict[str, tuple[str, str]]:
        """The pins as last read. Reading them fails closed: a ConfigMap we cannot read
        (RBAC, API down) means no result is believed until it can be read again."""
        with self._lock:
            stale = time.monotonic() - self._loaded > RELOAD_S
            if self._pins is None or (refresh and stale):
                self._loaded = time.monotonic()
                try:
                    _, self._pins = self._read()
                except ClusterError as e:
                    log.warning("cannot read the agents' pinned keys (%s/%s): %s",
                                self.ns, self.name, e)  # fmt: skip
                    if self._pins is None:
                        self._pins = {}  # tried again after RELOAD_S, not on every call
            return self._pins

    def verifier(self, node: str, uid: str) -> Verifier | None:
        """The pinned key of this Node object, or None (not pinned, or pinned for an
        earlier Node of that name)."""
        hit = self._current().get(node)
        if hit is None or hit[0] != uid:
            hit = self._current(refresh=True).get(node)
        if hit is None or hit[0] != uid:
            return None
        try:
            return Verifier.from_b64(hit[1])
        except BadKey:
            return None

    def pin(self, node: str, uid: str, key: str) -> bool:
        """Pin `key` for the Node object `uid` unless it has a pin; True when pinned now."""
        if not (uid and key):
            return False
        hit = self._current().get(node)
        if hit is not None and hit[0] == uid:
            if hit[1] != key and (node, key) not in self._warned:
                self._warned.add((node, key))
                log.warning(
                    "node %s publishes an agent key other than the one pinned: its results "
                    "are not believed (remove %s%s from ConfigMap %s/%s if its agent's state "
                    "was wiped)", node, PREFIX, node, self.ns, self.name,
                )  # fmt: skip
            return False
        self._change(node, f"{uid} {key}")
        return True

    def forget(self, node: str) -> None:
        if node in self._current():
            self._change(node, None)

    def _change(self, node: str, value: str | None) -> None:
        """Read-modify-write of the ConfigMap with its resourceVersion (other keys kept)."""
        for attempt in range(3):
            cm, _ = self._read()
            try:
                if cm is None:
                    if value is None:
                        return
                    body = {
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": self.name,
                                     "labels": {"app.kubernetes.io/part-of": "gpuvigil"}},
                        "data": {PREFIX + node: value},
                    }  # fmt: skip
                    self._write("pin", lambda t, b=body: self.core.create_namespaced_config_map(
                        self.ns, b, _request_timeout=t))  # fmt: skip
                else:
                    data = dict(cm.get("data") or {})
                    if value is None:
                        data.pop(PREFIX + node, None)
                    else:
                        data[PREFIX + node] = value
                    body = {"apiVersion": "v1", "kind": "ConfigMap", "data": data,
                            "metadata": {**cm["metadata"]}}  # fmt: skip
                    self._write("pin", lambda t, b=body: self.core.replace_namespaced_config_map(
                        self.name, self.ns, b, _request_timeout=t))  # fmt: skip
                break
            except Conflict:
                if attempt == 2:
                    raise
        with self._lock:
            _, self._pins = self._read()
            self._loaded = time.monotonic()
