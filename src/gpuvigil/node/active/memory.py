"""Device-memory pattern test over a fraction of free memory (GPU_MEMORY_FAULT).

Fills chunks with 0x00, 0xFF, 0xAA, 0x55 (every bit both ways, neighbours opposite) and
an address-dependent pattern (catches aliasing: two addresses backed by one cell), then
reads everything back on the device. Run inside the worker.
"""

from __future__ import annotations

import time
from typing import Any

from gpuvigil.node.active.config import ActiveConfig, GiB
from gpuvigil.node.active.results import Measurement

PATTERNS = (0x00, 0xFF, 0xAA, 0x55)
FIRST_BAD = 8  # offsets kept as evidence


def _allocate(ops: Any, i: int, target: int, chunk: int) -> tuple[list[Any], str | None]:
    torch = ops.torch
    chunks: list[Any] = []
    left = target
    while left > 0:
        size = min(chunk, left)
        try:
            chunks.append(ops.empty(i, size - size % 4, torch.uint8))
        except (RuntimeError, MemoryError) as e:  # OOM: test what we got, say so
            return chunks, f"allocation stopped after {target - left} bytes: {e}"[:300]
        left -= size
    return chunks, None


class _Tally:
    """Bad cells found so far, with the first few offsets as evidence."""

    def __init__(self) -> None:
        self.bad = 0
        self.offsets: list[int] = []

    def record(self, mask: Any, base: int) -> None:
        if not bool(mask.any().item()):  # the common case, and cheaper than counting
            return
        n = int(mask.sum().item())
        if n:
            self.bad += n
            if len(self.offsets) < FIRST_BAD:
                idx = mask.nonzero().flatten()[: FIRST_BAD - len(self.offsets)].tolist()
                self.offsets.extend(base + int(x) for x in idx)


def pattern_test(ops: Any, cfg: ActiveConfig) -> list[Measurement]:
    torch = ops.torch
    out = []
    for i in range(ops.count()):
        free = ops.free_bytes(i)
        target = int(free * cfg.memory_fraction) if free is not None else cfg.memory_bytes_cpu
        chunk = GiB if free is not None else max(1 << 20, target // 4)
        t0 = time.perf_counter()
        chunks, alloc_note = _allocate(ops, i, target, chunk)
        tested = sum(c.numel() for c in chunks)
        tally = _Tally()
        record = tally.record

        for value in PATTERNS:
            for c in chunks:
                ops.fill(i, c, value)
            ops.synchronize(i)
            base = 0
            for c in chunks:
                record(c != value, base)
                base += c.numel()
        base = 0
        for k, c in enumerate(chunks):
            words = c.view(torch.int32)
            ops.fill_index(i, words, k * 7919)
            expect = torch.arange(
                k * 7919, k * 7919 + words.numel(), dtype=torch.int32, device=words.device
            )
            record(words != expect, base)  # word offsets within the chunk, as evidence
            del expect
            base += c.numel()
        ops.synchronize(i)
        seconds = time.perf_counter() - t0
        del chunks
        ops.release()
        ev: dict[str, Any] = {
            "tested_bytes": tested,
            "target_bytes": target,
            "free_bytes": free,
            "patterns": [hex(p) for p in PATTERNS] + ["address"],
            "seconds": round(seconds, 3),
            "first_bad_offsets": tally.offsets,
        }
        if alloc_note:
            ev["allocation"] = alloc_note
        status, code, msg = "OK", None, ""
        bad = tally.bad
        if bad:
            status, code = "FAILED", "GPU_MEMORY_FAULT"
            msg = f"{bad} bytes/words read back wrong out of {tested} bytes tested"
        elif tested < target // 2:
            status, code = "WARNING", "GPU_MEMORY_FAULT"
            msg = f"only {tested} of {target} bytes could be allocated for the pattern test"
        out.append(
            Measurement(
                check="memory",
                component=ops.component(i),
                metric="bad_cells",
                achieved=float(bad),
                expected=0.0,
                unit="cells",
                status=status,
                code=code,
                message=msg,
                evidence=ev,
            )
        )
    return out
