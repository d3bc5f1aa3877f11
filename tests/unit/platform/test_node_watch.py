"""The node watch's event handling (`clusters.k8s_watch.NodeWatch`) fed watch events in the
API's own shapes (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes:
a watch from a resourceVersion that is too old gets an ERROR event whose object is a
Status with code 410). The real API server drives it in
tests/integration/controller/test_watch.py."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpuvigil.platform.clusters.k8s_watch import NodeWatch
from gpuvigil.platform.clusters.settings import KubernetesSettings


def node(name: str, rv: str, note: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv, "annotations": {"n": note}}}


class Core:
    """list_node as the API server answers it: a LIST page, or a watch that fails."""

    def __init__(self, items: list[dict[str, Any]], watch_status: int | None = None) -> None:
        self.items, self.watch_status = items, watch_status
        self.lists = 0

    def list_node(self, **kw: Any) -> Any:
        if kw.get("watch"):
            raise ApiException(status=self.watch_status or 500, reason="Gone")
        self.lists += 1
        import json

        class R:
            data = json.dumps({"metadata": {"resourceVersion": "100"}, "items": self.items})

        return R()


def watch(core: Core) -> NodeWatch:
    w = NodeWatch(core, KubernetesSettings(), Counter(), clock=lambda: 0.0)
    w._list()
    return w


def test_events_in_order_and_never_backwards() -> None:
    w = watch(Core([node("a", "90"), node("b", "95")]))
    assert not w._event({"type": "MODIFIED", "object": node("a", "101", "x")})
    assert not w._event({"type": "MODIFIED", "object": node("a", "99", "older")})  # stale
    assert w.get("a")["metadata"]["annotations"]["n"] == "x"  # type: ignore[index]
    assert not w._event({"type": "DELETED", "object": node("b", "102")})
    assert not w._event({"type": "ADDED", "object": node("c", "103")})
    assert not w._event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "110"}}})
    assert {n["metadata"]["name"] for n in w.nodes()} == {"a", "c"}
    assert w._rv == "110"  # a bookmark moves where the next watch starts


def test_410_gone_as_an_event_or_a_status_lists_again() -> None:
    w = watch(Core([node("a", "90")]))
    gone = {
        "type": "ERROR",
        "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version: 2 (184)", "reason": "Expired", "code": 410,
        },
    }  # fmt: skip
    assert w._event(gone)  # True: the cache must be rebuilt from a LIST
    core = Core([node("a", "90")], watch_status=410)
    w = watch(core)
    assert w._watch() is True


def test_our_own_write_shows_before_the_watch_brings_it() -> None:
    w = watch(Core([node("a", "90")]))
    w.remember(node("a", "120", "mine"))
    w._event({"type": "MODIFIED", "object": node("a", "110", "theirs, earlier")})
    assert w.get("a")["metadata"]["annotations"]["n"] == "mine"  # type: ignore[index]


def test_a_refused_watch_is_blind_at_once_and_a_failing_one_after_two_passes(caplog) -> None:  # type: ignore[no-untyped-def]
    import logging
    import threading

    import pytest

    from gpuvigil.platform.clusters.base import Unavailable

    t = {"now": 0.0}
    w = NodeWatch(Core([node("a", "90")], watch_status=403), KubernetesSettings(), Counter(),
                  clock=lambda: t["now"])  # fmt: skip
    w._list()
    assert w.blind(20) is None  # the LIST worked
    w._start()
    with caplog.at_level(logging.INFO, logger="gpuvigil.clusters.kubernetes"):
        deadline = threading.Event()
        for _ in range(50):
            if w.blind(20):
                break
            deadline.wait(0.05)
    w.stop()
    assert "refused" in (w.blind(20) or "")
    assert [r.levelname for r in caplog.records if "node watch" in r.message][:1] == ["WARNING"]
    with pytest.raises(Unavailable, match="refused"):
        w.nodes()  # the next pass acts on nothing
    # a 500 on every try (not refused): blind once it has lasted the two passes asked
    w = NodeWatch(Core([node("a", "90")], watch_status=500), KubernetesSettings(), Counter(),
                  clock=lambda: t["now"])  # fmt: skip
    w._list()
    w._failed(Unavailable("500 Gone"))
    t["now"] = 19.0
    assert w.blind(20) is None and w.nodes()
    t["now"] = 21.0
    assert "failed for 21 s" in (w.blind(20) or "")
