"""Pytest fixtures for the real servers. Under CI=true a missing component fails.

- `kube`: a session-wide kube-apiserver + etcd (`KubeCluster`); tests create uniquely
  named nodes and namespaces. `kube.start_scheduler()` / `kube.start_disruption_controller()`
  on demand.
- `slurm`: a session-wide 4-node Slurm cluster (`SlurmCluster`), reset to all-idle before
  each test that asks for it.
- `prometheus_factory(targets)`: a Prometheus server per call, stopped at teardown.
- `chromium`: the `realparts.chromium` module, after checking Chromium is installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Protocol, TypeVar

import pytest

from realparts import chromium as chromium_mod
from realparts import kube as kube_mod
from realparts import prometheus as prom_mod
from realparts import slurm as slurm_mod
from testkit import require


class _Server(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Server)


def _session(parts: ModuleType, make: Callable[[Path], S]) -> Iterator[S]:
    """One server of `parts` (`available`, `make_workdir`) for the session: started in
    its own folder, stopped and its folder removed at the end."""
    ok, why = parts.available()
    require(ok, why)
    workdir = parts.make_workdir()
    server = make(workdir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kube() -> Iterator[kube_mod.KubeCluster]:
    yield from _session(kube_mod, kube_mod.KubeCluster)


@pytest.fixture(scope="session")
def _slurm_session() -> Iterator[slurm_mod.SlurmCluster]:
    yield from _session(slurm_mod, slurm_mod.SlurmCluster)


@pytest.fixture
def slurm(_slurm_session: slurm_mod.SlurmCluster) -> slurm_mod.SlurmCluster:
    _slurm_session.reset()
    return _slurm_session


@pytest.fixture
def prometheus_factory() -> Iterator[Callable[..., prom_mod.Prometheus]]:
    ok, why = prom_mod.available()
    require(ok, why)
    started: list[prom_mod.Prometheus] = []

    def start(targets: list[str], **kw: object) -> prom_mod.Prometheus:
        rule_files = kw.pop("rule_files", None)
        p = prom_mod.Prometheus(prom_mod.make_workdir(), targets, **kw)  # type: ignore[arg-type]
        started.append(p)
        p.start(rule_files=rule_files)  # type: ignore[arg-type]
        return p

    yield start
    for p in started:
        p.stop()
        shutil.rmtree(p.dir, ignore_errors=True)


@pytest.fixture
def chromium() -> ModuleType:
    ok, why = chromium_mod.available()
    require(ok, why)
    return chromium_mod
