"""Fault injectors for the active checks: wrap the compute, keep the expectations.

Each function takes the real ops (`gpuvigil.node.active.ops.TorchOps`) and returns them
wrapped; name one as `module:function` (e.g. `gpuvigil.fakes.active:wrong_matmul`) in
`runner.run_active(..., wrapper=...)`. The worker imports it inside its own process, so
hangs and crashes happen where the real ones would. Faults hit device index 1 where a
"one bad GPU among healthy peers" matters, else every device.
Used by the tests and the simulator; production code never imports this module.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from gpuvigil.node.active.ops import OpsWrapper

BAD = 1  # the faulty device


class _WrongMatmul(OpsWrapper):
    """A stuck high bit: one element of every product on device 1 is off by a lot."""

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        out = self.inner.matmul(i, a, b)
        if i == BAD:
            out = out.clone()
            out.view(-1)[7] += 1024.0
        return out


class _FlakyMatmul(OpsWrapper):
    """Right the first time, then a low-order change: only repeats reveal it."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.calls = 0

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        out = self.inner.matmul(i, a, b)
        if i == BAD:
            self.calls += 1
            if self.calls > 1:
                out = out.clone()
                flat = out.view(-1)
                flat[3] = flat[3] * (1 + 2**-6)
        return out


class _SubtleMatmul(OpsWrapper):
    """Device 1 flips the lowest mantissa bit of one element, the same way every time:
    within every tolerance and repeatable; only its identical peers can expose it."""

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        out = self.inner.matmul(i, a, b)
        if i == BAD:
            out = out.clone()
            flat = out.view(-1)
            flat[5] = self.torch.nextafter(flat[5], flat[5] * 2)
        return out


class _SlowMatmul(OpsWrapper):
    """Device 1 takes 20x as long (a power-braked or throttled GPU)."""

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        t0 = time.perf_counter()
        out = self.inner.matmul(i, a, b)
        if i == BAD:
            time.sleep((time.perf_counter() - t0) * 19 + 0.002)
        return out


class _AllSlowMatmul(OpsWrapper):
    """Every device slow: below the expected figure though equal to its peers."""

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        time.sleep(0.02)
        return self.inner.matmul(i, a, b)


class _HangingMatmul(OpsWrapper):
    """A kernel on device 1 that never completes."""

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        while i == BAD:
            time.sleep(1)
        return self.inner.matmul(i, a, b)


class _FrozenMatmul(OpsWrapper):
    """On device 1 the whole process stops (as in uninterruptible sleep in a driver): even
    its own watchdog cannot run; only the parent's deadline ends it."""

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        if i == BAD:
            os.kill(os.getpid(), signal.SIGSTOP)
        return self.inner.matmul(i, a, b)


class _CrashingMatmul(OpsWrapper):
    """The process dies mid-check on device 1 (a segfault in a driver library)."""

    def matmul(self, i: int, a: Any, b: Any) -> Any:
        if i == BAD:
            os._exit(139)
        return self.inner.matmul(i, a, b)


class _BadMemory(OpsWrapper):
    """A stuck-at-zero bit in device 1's memory: every 0xFF/0xAA write loses bit 1."""

    def fill(self, i: int, t: Any, value: int) -> None:
        self.inner.fill(i, t, value)
        if i == BAD and t.numel() > 4099:
            t[4099] = value & ~0x02


class _EccError(OpsWrapper):
    """Device 1 raises the CUDA error an uncorrectable ECC error produces."""

    def fill(self, i: int, t: Any, value: int) -> None:
        if i == BAD:
            raise RuntimeError("CUDA error: uncorrectable ECC error encountered")
        self.inner.fill(i, t, value)


class _SlowCopy(OpsWrapper):
    """Device 1's link trained down: each of its copies takes 0.2 s longer."""

    def copy(self, i: int, dst: Any, src: Any) -> None:
        if i == BAD:
            time.sleep(0.2)
        self.inner.copy(i, dst, src)


class _SlowAllReduce(OpsWrapper):
    def all_reduce(self, t: Any) -> None:
        time.sleep(0.1)
        self.inner.all_reduce(t)


class _WrongAllReduce(OpsWrapper):
    def all_reduce(self, t: Any) -> None:
        self.inner.all_reduce(t)
        t.view(-1)[0] += 1.0


def wrong_matmul(ops: Any) -> Any:
    return _WrongMatmul(ops)


def flaky_matmul(ops: Any) -> Any:
    return _FlakyMatmul(ops)


def subtle_matmul(ops: Any) -> Any:
    return _SubtleMatmul(ops)


def slow_matmul(ops: Any) -> Any:
    return _SlowMatmul(ops)


def all_slow_matmul(ops: Any) -> Any:
    return _AllSlowMatmul(ops)


def hanging_matmul(ops: Any) -> Any:
    return _HangingMatmul(ops)


def frozen_matmul(ops: Any) -> Any:
    return _FrozenMatmul(ops)


def crashing_matmul(ops: Any) -> Any:
    return _CrashingMatmul(ops)


def bad_memory(ops: Any) -> Any:
    return _BadMemory(ops)


def ecc_error(ops: Any) -> Any:
    return _EccError(ops)


def slow_copy(ops: Any) -> Any:
    return _SlowCopy(ops)


def slow_all_reduce(ops: Any) -> Any:
    return _SlowAllReduce(ops)


def wrong_all_reduce(ops: Any) -> Any:
    return _WrongAllReduce(ops)
