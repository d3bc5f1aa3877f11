"""The node's typed facts: the latest reading of each type, and the one before it.

Written by whoever learns something (a probe's readout, the kernel-log stream, the
remediator after a GPU reset, a person's release) and read by `pipeline.judge` for the
rules that declared the type. Keyed by the reading's class, so what travels between
checks is always a typed value, never an entry of an untyped dict. Thread-safe: the
agent's checks, its kernel-log stream and its sinks run on threads of their own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, TypeVar

T = TypeVar("T")


class Facts:
    def __init__(self, readings: Iterable[object] = ()) -> None:
        self._latest: dict[type, Any] = {}
        self._previous: dict[type, Any] = {}
        self._lock = threading.Lock()
        for r in readings:
            self.put(r)

    def put(self, reading: object) -> None:
        """`reading` becomes the latest of its type; the one it replaces, the previous."""
        with self._lock:
            cls = type(reading)
            if cls in self._latest:
                self._previous[cls] = self._latest[cls]
            self._latest[cls] = reading

    def get(self, cls: type[T]) -> T | None:
        with self._lock:
            return self._latest.get(cls)

    def previous(self, cls: type[T]) -> T | None:
        """The reading of this type before the latest (for rates between two readings)."""
        with self._lock:
            return self._previous.get(cls)

    def drop(self, cls: type) -> None:
        with self._lock:
            self._latest.pop(cls, None)
            self._previous.pop(cls, None)

    def __contains__(self, cls: type) -> bool:
        with self._lock:
            return cls in self._latest
