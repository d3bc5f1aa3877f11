"""The nodes as the API server last said: one paged LIST, then a WATCH from its
resourceVersion, kept in memory. Used by `clusters.kubernetes` instead of listing every
node on every pass (5,000 nodes were 4.3 MB every 10 s).

- The watch asks for bookmarks and ends server-side after `watch_timeout_s`; it is then
  opened again from the last resourceVersion seen (no re-list). A stream that stalls
  without closing is cut by the client's read timeout (`watch_timeout_s` + 30 s).
- `410 Gone` (the resourceVersion is too old: etcd compacted it) means events were missed:
  the nodes are listed again and the cache replaced at once.
- Anything it hears (an event, a bookmark, a fresh list, a watch opened) is "an event";
  `age_s()` is the time since the last one (`gpuvigil_controller_watch_last_event_age_seconds`).
  Past `watch_stale_s`, `nodes()` raises Unavailable: the controller acts on nothing
  rather than on a picture of the cluster it cannot vouch for, and /healthz fails.
- A watch the server refuses (401/403: the RBAC lacks `watch nodes`) is a controller that
  will never see a change: it is logged at WARNING, `nodes()` raises Unavailable from the
  next pass on, and `blind()` says so at once (/healthz fails). Any other failure to open
  the watch is logged at WARNING too, and counts as blind once it has lasted `after_s`.
- The adapter's own writes update the cache from their responses (`remember`), so a pass
  sees its own previous writes even if the watch lags; an older version never overwrites
  a newer one.
"""

from __future__ import annotations

import atexit
import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from gpuvigil.platform.clusters.base import Forbidden, Unavailable
from gpuvigil.platform.clusters.k8s_api import api_call, map_error
from gpuvigil.platform.clusters.settings import KubernetesSettings

log = logging.getLogger("gpuvigil.clusters.kubernetes")

Raw = dict[str, Any]


def _newer(new: str, old: str) -> bool:
    """resourceVersions are opaque, but etcd's are increasing integers: compare those;
    anything else counts as newer (the last word wins)."""
    if new.isdigit() and old.isdigit():
        return int(new) >= int(old)
    return True


class NodeWatch:
    def __init__(
        self,
        core: Any,
        settings: KubernetesSettings,
        calls: Counter[str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core, self.settings, self.calls = core, settings, calls
        self.clock = clock
        self._nodes: dict[str, Raw] = {}
        self._rv = ""
        self._lock = threading.Lock()
        self._heard = 0.0  # clock() of the last event, bookmark, list or opened watch
        self._synced = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self.relists = 0  # how often a 410 (or a broken stream) forced a new LIST
        # Why the last attempt to watch failed, since when (clock()), and whether the server
        # refused it (no retry can fix that); cleared when a watch opens.
        self._trouble: str | None = None
        self._trouble_since = 0.0
        self._denied = False

    # ---- what the adapter asks --------------------------------------------------------

    def nodes(self) -> list[Raw]:
        """Every node; the first call lists synchronously (and raises what the LIST
        raises) and starts the watch, later calls read the cache the watch keeps. Without
        `settings.watch`, every call lists."""
        if not self.settings.watch:
            self._list()
        elif not self._synced:
            self._list()
            self._start()
        if self._denied:
            raise Unavailable(
                f"the node watch is refused ({self._trouble}): not acting on a picture "
                "that can never change; grant `watch` on nodes (deploy/kubernetes/controller)"
            )
        age = self.age_s()
        if age > self.settings.watch_stale_s:
            raise Unavailable(
                f"the node watch heard nothing for {age:.0f} s (limit "
                f"{self.settings.watch_stale_s:.0f} s): not acting on an old picture"
            )
        with self._lock:
            return list(self._nodes.values())

    def age_s(self) -> float:
        return max(0.0, self.clock() - self._heard) if self._synced else 0.0

    def blind(self, after_s: float) -> str | None:
        """Why this watch cannot see the cluster, or None: refused by the server (at once),
        or failing to open for longer than `after_s`."""
        trouble = self._trouble
        if trouble is None:
            return None
        if self._denied:
            return f"the node watch is refused: {trouble}"
        lasted = self.clock() - self._trouble_since
        if lasted > after_s:
            return f"the node watch has failed for {lasted:.0f} s: {trouble}"
        return None

    def remember(self, raw: Raw) -> None:
        """A node object the API server returned to one of our writes."""
        meta = raw.get("metadata") or {}
        name, rv = meta.get("name"), str(meta.get("resourceVersion") or "")
        if not name:
            return
        with self._lock:
            old = self._nodes.get(name)
            if old is None or _newer(rv, str(old["metadata"].get("resourceVersion") or "")):
                self._nodes[name] = raw

    def get(self, name: str) -> Raw | None:
        with self._lock:
            return self._nodes.get(name)

    def forget(self, name: str) -> None:
        """A node we deleted (replace): gone before the watch says so."""
        with self._lock:
            self._nodes.pop(name, None)

    def stop(self) -> None:
        """End the watch now. The stream is cut with a socket shutdown, never with
        `resp.close()` from this thread: closing a TLS socket another thread is reading
        waits for that read, i.e. for the server to end the watch (up to `watch_timeout_s`),
        which made a SIGTERMed controller take 43-57 s to exit."""
        self._stop.set()
        sock = _socket_of(self._resp)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the reader wakes at once with EOF
            except OSError:  # already closed
                pass
        if self._thread is not None:
            self._thread.join(timeout=2)

    # ---- listing and watching ---------------------------------------------------------

    def _selector(self) -> dict[str, str]:
        sel = self.settings.node_selector
        return {"label_selector": sel} if sel else {}

    def _list(self) -> None:
        """One consistent paged LIST; replaces the cache and sets the watch's start."""
        items: list[Raw] = []
        rv = ""
        token = None
        while True:
            extra = {"_continue": token} if token else {}
            self.calls["list_nodes"] += 1
            resp = api_call(
                lambda extra=extra: self.core.list_node(
                    limit=self.settings.list_page_size,
                    _preload_content=False,
                    _request_timeout=self.settings.request_timeout_s,
                    **self._selector(),
                    **extra,
                )
            )
            page = json.loads(resp.data)
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            rv = rv or str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                break
        with self._lock:
            self._nodes = {n["metadata"]["name"]: n for n in items}
            self._rv = rv
            self._heard = self.clock()
            self._synced = True

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="node-watch", daemon=True)
            self._thread.start()
            atexit.register(self.stop)  # never leave the thread inside a TLS read at exit

    def _run(self) -> None:
        """client-go's reflector: watch from the last resourceVersion seen, again and
        again; list again only when the server says that version is gone (410)."""
        backoff = 1.0
        while not self._stop.is_set():
            try:
                if self._watch():
                    self.relists += 1
                    self._list()
                backoff = 1.0
            except Exception as e:  # noqa: BLE001  (any break: watch again from _rv)
                if self._stop.is_set():
                    return
                self._failed(e)
                log.warning("node watch: %s: %s; again in %.0f s", type(e).__name__, e, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _watch(self) -> bool:
        """Follow one watch stream to its end. Returns True when the cache must be rebuilt
        from a LIST (410 Gone, or the server said the stream is unusable)."""
        timeout = int(self.settings.watch_timeout_s)
        self.calls["watch_nodes"] += 1
        try:
            resp = self.core.list_node(
                watch=True,
                resource_version=self._rv,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=(self.settings.request_timeout_s, timeout + 30),
                **self._selector(),
            )
        except ApiException as e:
            if e.status == 410:
                return True
            raise map_error(e) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise Unavailable(f"node watch: {e}") from e
        self._resp = resp
        self._heard = self.clock()
        self._trouble, self._denied = None, False
        try:
            for line in _lines(resp):
                if self._stop.is_set():
                    return False
                if self._event(json.loads(line)):
                    return True
        finally:
            self._resp = None
            resp.release_conn()
        return False

    def _event(self, ev: Raw) -> bool:
        kind, obj = ev.get("type"), ev.get("object") or {}
        self._heard = self.clock()
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        if kind == "ERROR":  # a Status: 410 Gone (compacted) or another server complaint
            log.warning("node watch: %s %s", obj.get("code"), obj.get("message", "")[:200])
            return True
        with self._lock:
            if rv:
                self._rv = rv
            if kind == "BOOKMARK":
                return False
            name = meta.get("name")
            if not name:
                return False
            if kind == "DELETED":
                self._nodes.pop(name, None)
            elif kind in ("ADDED", "MODIFIED"):
                old = self._nodes.get(name)
                if old is None or _newer(rv, str(old["metadata"].get("resourceVersion") or "")):
                    self._nodes[name] = obj
        return False

    def _failed(self, e: Exception) -> None:
        if self._trouble is None:
            self._trouble_since = self.clock()
        self._trouble = f"{type(e).__name__}: {e}"[:300]
        self._denied = isinstance(e, Forbidden)


def _socket_of(resp: Any) -> socket.socket | None:
    """The TCP socket under a streaming urllib3 response (TLS wrapped or not), if open."""
    conn = getattr(resp, "connection", None) if resp is not None else None
    sock = getattr(conn, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _lines(resp: Any) -> Iterator[str]:
    """Newline-delimited JSON from a streaming response (one watch event per line)."""
    buf = bytearray()
    for chunk in resp.stream(None, decode_content=False):
        buf += chunk
        start = 0
        while (i := buf.find(b"\n", start)) >= 0:
            line = bytes(buf[start:i]).strip()
            start = i + 1
            if line:
                yield line.decode("utf-8", errors="replace")
        del buf[:start]
