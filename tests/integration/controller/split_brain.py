"""Shared by the split-brain tests on a real kube-apiserver and on real Slurm: two
`gpuvigil controller` processes, one with its wall clock 20 s ahead (libfaketime), a leader
paused past its lease (SIGSTOP) and resumed, then killed; and the checks over what the
cluster recorded of their writes."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ctl_helpers import controller_argv, controller_env, wait_for

from gpuvigil.platform.state import decode_record
from testkit import require

SKEW = "+20s"


def faketime_env() -> dict[str, str]:
    """libfaketime preloaded into the controller itself (the `faketime` command would fork,
    and a SIGKILL would then miss the controller), 20 s ahead; the wall clock only (NTP
    skew leaves a host's monotonic clock alone, and so does this). The library comes from
    the `libfaketime` dev dependency: Debian bookworm's 0.9.10 turns Python 3.11's
    time.sleep into EINVAL when the monotonic clock is excluded (wolfcw/libfaketime#426)."""
    spec = importlib.util.find_spec("libfaketime")
    require(spec is not None and spec.origin is not None, "libfaketime (dev extra) missing")
    assert spec is not None and spec.origin is not None
    lib = Path(spec.origin).parent / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    require(lib.exists(), f"{lib} missing")
    return {
        "LD_PRELOAD": str(lib),
        "FAKETIME": SKEW,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


@dataclass
class Replica:
    ident: str
    proc: subprocess.Popen[bytes]
    log: Path

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(ident: str, cfg: Path, workdir: Path, *, env: dict[str, str], skewed: bool) -> Replica:
    log = workdir / f"controller-{ident}.log"
    argv = controller_argv("controller", "--config", str(cfg), "--identity", ident)
    extra = dict(env)
    if skewed:
        extra.update(faketime_env())
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=controller_env(extra), stdout=out, stderr=subprocess.STDOUT
        )
    return Replica(ident, proc, log)


def run_disruptions(
    a: Replica,
    b: Replica,
    *,
    holder: Callable[[], str | None],
    lease_s: float,
    acted: Callable[[str], bool],
) -> None:
    """a leads; b (skewed) must stay standby; a is paused past its lease, b takes over,
    a resumes (and must not act); once b has acted, b is killed and a takes over again.
    `acted(ident)`: the cluster recorded a write of that replica."""
    wait_for(lambda: holder() == a.ident, 60, f"{a.ident} to lead")
    until = time.monotonic() + 3 * lease_s  # several lease durations: b never steals it
    while time.monotonic() < until:
        assert holder() == a.ident, "the skewed standby took a live lease"
        time.sleep(0.5)
    a.signal(signal.SIGSTOP)
    wait_for(lambda: holder() == b.ident, 60, f"{b.ident} to take over from the paused leader")
    time.sleep(1.0)
    a.signal(signal.SIGCONT)  # wakes mid-pass, believing it leads: its fence must stop it
    time.sleep(2 * lease_s)  # it must stay quiet all this time (checked from the records)
    wait_for(lambda: acted(b.ident), 120, f"{b.ident} to act as the leader")
    assert holder() == b.ident
    b.signal(signal.SIGKILL)
    b.proc.wait()
    wait_for(lambda: holder() == a.ident, 60, f"{a.ident} to take over from the dead leader")


def max_in_budget(stores: Iterable[tuple[str, str]]) -> int:
    """Replay (node, stored record) in the order the cluster applied them: the most nodes
    in the disruption budget at any moment."""
    now: set[str] = set()
    peak = 0
    for node, text in stores:
        rec = decode_record(text)
        if rec is not None and rec.in_budget:
            now.add(node)
        else:
            now.discard(node)
        peak = max(peak, len(now))
    return peak
