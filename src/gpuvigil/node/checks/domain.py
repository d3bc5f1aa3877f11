"""A health domain's spec, and the scan that finds every domain and its checks and rules.

A domain is one folder under `node/checks/` (gpu, kernel_log, fabric, ...): its probes,
readings and rules side by side, and in its `__init__.py` one `DOMAIN = Domain(...)` that
names it, the finding codes it owns, the captured outputs `gpuvigil analyze` reads with it
(`formats`) and how the simulator fakes its readings (`fake`). `load_domains` imports every
module of every domain folder, so whatever registers itself on import (`@check`, `@rule`)
is registered without a hand-kept list; `sweep.load_checks` and `pipeline.judge.load_rules`
both call it. `find_domains` imports only the specs, for what needs the formats and not the
checks (`analyze --help`, telling a file's kind).

The consumers iterate the specs and name no domain: `capture.kinds` (the kinds, detection
order, readers), `sim.hardware` (each domain's fake readings), docs/checks.md's test.

The codes themselves stay rows in `core/codes.py` (core imports nothing of ours, and the
platform's policy, attribution and NPD read them across layers); a domain names them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

PACKAGE = "gpuvigil.node.checks"
# The modules of `node/checks` itself that are not domain folders.
_REGISTRY_MODULES = frozenset({"domain", "domain_doc", "registry"})
# A domain's module that only the simulator imports (`Domain.fake`): it builds readings
# from `gpuvigil.fakes`, which production code may not import (an import-linter contract),
# so `load_domains` leaves it out.
FAKE_MODULE = "fake"


@dataclass(frozen=True)
class Detector:
    """How `analyze` tells a format from the first 64 KiB of a file: `test(text, lines)`
    (`lines`: the non-blank lines) is a "module:function" of the domain folder. `rank`
    orders every domain's detectors in one sequence, lowest first, the first that says
    yes wins: a tool's own header (10-39) before a shape (40-59) before the kernel-log
    guess (60), the loosest. Ties go by kind name."""

    rank: int
    test: str


@dataclass(frozen=True)
class Format:
    """One kind of captured output `gpuvigil analyze` reads (what `--kind` takes).

    `check`: the check its findings belong to, as in `gpuvigil check`; `what`: the
    command that prints it, for people. `read`: "module:function" of the domain folder,
    text -> readings (the same readings the live checks build, judged by the same rules);
    None for a kind `analyze` reads itself (the kernel log, streamed; a sysfs tree, a
    folder). Names are resolved on use, so a spec imports no reader."""

    kind: str
    check: str
    what: str
    read: str | None = None
    detect: tuple[Detector, ...] = ()


@dataclass(frozen=True)
class Domain:
    """What one domain folder declares. `codes` are the core.codes names it owns (each
    code is owned by exactly one domain, `tests/unit/node/test_domains.py`); `also_emits`
    are codes another domain owns that this domain's rules emit too (a lost GPU is seen
    by NVML and in the kernel log alike). `formats`: the captured outputs `analyze` reads
    with this domain's readers. `fake`: "fake:function" (the folder's `fake.py`), a
    simulated node carrying a fault (`gpuvigil.fakes.faulty.FaultyNode`) -> the readings
    this domain's probes would take of it (`fakes.faulty.Seen`, empty when they see
    nothing of that fault); None: the simulator has no fake for this domain."""

    name: str
    summary: str
    codes: tuple[str, ...]
    also_emits: tuple[str, ...] = ()
    formats: tuple[Format, ...] = ()
    fake: str | None = None

    def resolve(self, ref: str) -> Callable[..., Any]:
        """The function a "module:function" of this domain's folder names."""
        module, _, name = ref.partition(":")
        fn = getattr(importlib.import_module(f"{PACKAGE}.{self.name}.{module}"), name, None)
        if not callable(fn):
            raise DomainError(f"node/checks/{self.name}: {ref!r} names no function")
        return fn  # type: ignore[no-any-return]


class DomainError(LookupError):
    """A folder under node/checks that is not a well-formed domain."""


def load_domains(package: str = PACKAGE) -> dict[str, Domain]:
    """Import every domain folder directly under `package` and every module inside it
    (but `fake`), sorted by name so the order of registration (and of `judge`'s findings)
    does not depend on the file system's order. Returns the domains by name."""
    domains = find_domains(package)
    for spec in domains.values():
        folder = importlib.import_module(f"{package}.{spec.name}")
        for name in modules_of(folder):
            if name.rpartition(".")[2] != FAKE_MODULE:
                importlib.import_module(name)
    return domains


def find_domains(package: str = PACKAGE) -> dict[str, Domain]:
    """Every domain's spec, importing only the folders' `__init__.py` (their formats
    without their readers, checks and rules). Sorted by name."""
    root = importlib.import_module(package)
    domains: dict[str, Domain] = {}
    for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name):
        if not info.ispkg:
            continue  # the registry's own modules (this one): not a domain
        folder = importlib.import_module(f"{package}.{info.name}")
        spec = getattr(folder, "DOMAIN", None)
        if not isinstance(spec, Domain):
            raise DomainError(
                f"node/checks/{info.name}/ ({folder.__file__}) has no DOMAIN = Domain(...) "
                "in its __init__.py: every folder under node/checks is a domain"
            )
        if spec.name != info.name:
            raise DomainError(
                f"node/checks/{info.name}/ declares DOMAIN.name {spec.name!r}: "
                "a domain is named after its folder"
            )
        domains[spec.name] = spec
    return domains


def modules_of(package: ModuleType) -> list[str]:
    """Every module under `package`, subpackages included, in name order."""
    names: list[str] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        name = f"{package.__name__}.{info.name}"
        names.append(name)
        if info.ispkg:
            names += modules_of(importlib.import_module(name))
    return names


def domain_of(module: str, package: str = PACKAGE) -> str | None:
    """The domain a module belongs to (`gpuvigil.node.checks.gpu.rules.memory` -> "gpu"),
    or None for a module outside every domain folder."""
    prefix = package + "."
    if not module.startswith(prefix):
        return None
    head = module[len(prefix) :].partition(".")[0]
    return None if head in _REGISTRY_MODULES else head
