"""Pure judgements of the active checks: errors vs tolerance, throughput vs expected,
a device vs its peers, and nccl-tests' bus bandwidth. Called by `node/active/*` (in the
worker) and unit-tested on their own; no torch, no clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

# Largest normalised error |C - C_ref| / (sqrt(K) * rms(A) * rms(B)) accepted per dtype,
# with C_ref computed in float64 from the same (already rounded) inputs, so the error is
# only accumulation and output rounding. For unit-normal inputs the normalised product is
# ~N(0, 1), its largest element over 2048^2 outputs ~5.3, i.e. in the binade [4, 8), where
# half an ulp is 0.0156 in bf16 and 0.0020 in fp16; torch also allows reduced-precision
# split-K reductions in both, hence ~3x and ~5x headroom. tf32 rounds fp32 inputs to a
# 10-bit mantissa (expected max ~0.002-0.005). A flipped exponent or high mantissa bit in
# any element is an error of order 1 or more.
TOLERANCE = {"bf16": 5e-2, "fp16": 1e-2, "tf32": 1e-2, "fp32": 1e-4}


def busbw(nbytes: float, seconds: float, world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s: algbw * 2 (n - 1) / n."""
    if seconds <= 0 or world < 1 or not math.isfinite(seconds):
        return 0.0
    return nbytes / seconds / 1e9 * (2.0 * (world - 1) / world)


def below(achieved: float | None, expected: float | None, fraction: float) -> bool:
    """True when both figures are known and achieved < fraction * expected."""
    if achieved is None or expected is None or expected <= 0:
        return False
    if not math.isfinite(achieved):
        return True
    return achieved < fraction * expected


def ratio(achieved: float | None, expected: float | None) -> float | None:
    if achieved is None or expected is None or expected <= 0 or not math.isfinite(achieved):
        return None
    return achieved / expected


def laggards(values: Mapping[str, float], fraction: float) -> dict[str, float]:
    """Components below `fraction` of the median of their peers: {component: median}."""
    finite = {k: v for k, v in values.items() if math.isfinite(v)}
    if len(finite) < 2:
        return {}
    med = statistics.median(finite.values())
    return {k: med for k, v in finite.items() if v < fraction * med}


def wrong(error: float | None, dtype: str) -> bool:
    """A result error beyond the dtype's tolerance (NaN or inf is always wrong)."""
    if error is None:
        return False
    return not math.isfinite(error) or error > TOLERANCE.get(dtype, 1e-4)
