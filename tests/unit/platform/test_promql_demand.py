"""The PromQL demand reader's parser: one number or a reason, never an exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvigil.platform.clusters.promql import parse, read


def answer(kind: str, result: object) -> str:
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}})


@pytest.mark.parametrize(
    ("body", "replicas", "error"),
    [
        (answer("vector", [{"metric": {}, "value": [1764676800.5, "3.2"]}]), 4, ""),
        (answer("scalar", [1764676800, "7"]), 7, ""),
        (answer("vector", []), None, "0 samples"),
        (answer("vector", [{"value": [1, "1"]}, {"value": [1, "2"]}]), None, "2 samples"),
        (answer("vector", [{"value": [1, "NaN"]}]), None, "not a replica count"),
        (answer("vector", [{"value": [1, "-1"]}]), None, "not a replica count"),
        (answer("matrix", []), None, "result type"),
        (json.dumps({"status": "error", "error": "parse error"}), None, "parse error"),
        ("<html>", None, "not JSON"),
    ],
)
def test_parse(body: str, replicas: int | None, error: str) -> None:
    d = parse(body)
    assert d.replicas == replicas and error in d.error
    assert (d.at is not None) == (replicas is not None)


@given(st.binary(max_size=300))
def test_garbage_never_raises(body: bytes) -> None:
    d = parse(body)
    assert d.replicas is None or d.replicas >= 0


def test_an_unreachable_prometheus_is_a_missing_signal() -> None:
    d = read("http://127.0.0.1:9", "up", timeout_s=1)
    assert d.replicas is None and "unreachable" in d.error
