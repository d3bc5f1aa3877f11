"""One PromQL instant query that answers one number: a serving pool's demand in replicas.

Called by `clusters.k8s_serving` for a `promql` demand source. Never raises: a timeout, a
refused connection, an error status, no sample or several samples, or a value that is not a
finite number is a `Demand` with `error` set (the gate then holds: a missing signal).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

from gpuvigil.platform.capacity import Demand

MAX_BODY = 1 << 20  # one number's answer is small; a bigger one is not what we asked for


def read(url: str, query: str, *, timeout_s: float, source: str = "promql") -> Demand:
    full = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as resp:
            body = resp.read(MAX_BODY + 1)
    except urllib.error.HTTPError as e:
        return Demand(source, None, None, f"Prometheus answered {e.code}")
    except (urllib.error.URLError, OSError, ValueError) as e:
        return Demand(source, None, None, f"Prometheus unreachable: {e}")
    if len(body) > MAX_BODY:
        return Demand(source, None, None, "answer too large")
    return parse(body, source=source)


def parse(body: bytes | str, *, source: str = "promql") -> Demand:
    """The answer of /api/v1/query: a scalar, or a vector of exactly one sample."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        return Demand(source, None, None, "answer is not JSON")
    if not isinstance(data, dict) or data.get("status") != "success":
        why = data.get("error") if isinstance(data, dict) else None
        return Demand(source, None, None, f"query failed: {str(why or 'no status')[:200]}")
    result = data.get("data") if isinstance(data.get("data"), dict) else {}
    kind, value = result.get("resultType"), result.get("result")
    if kind == "vector" and isinstance(value, list):
        if len(value) != 1:
            return Demand(source, None, None, f"{len(value)} samples, want exactly 1")
        sample = value[0].get("value") if isinstance(value[0], dict) else None
    elif kind == "scalar":
        sample = value
    else:
        return Demand(source, None, None, f"result type {kind!r}, want vector or scalar")
    try:
        ts, text = sample  # type: ignore[misc]
        at = datetime.fromtimestamp(float(ts), tz=UTC)
        number = float(text)
    except (TypeError, ValueError, OverflowError, OSError):
        return Demand(source, None, None, "sample is not [time, number]")
    if not math.isfinite(number) or number < 0:
        return Demand(source, None, None, f"value {text!r} is not a replica count")
    return Demand(source, math.ceil(round(number, 9)), at)
