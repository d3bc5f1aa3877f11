"""A health domain's spec, and the scan that finds every domain and its checks and rules.

A domain is one folder under `node/checks/` (gpu, kernel_log, fabric, ...): its probes,
readings and rules side by side, and in its `__init__.py` one `DOMAIN = Domain(...)` that
names it and the finding codes it owns. `load_domains` imports every module of every
domain folder, so whatever registers itself on import (`@check`, `@rule`) is registered
without a hand-kept list; `sweep.load_checks` and `pipeline.judge.load_rules` both call it.

The codes themselves stay rows in `core/codes.py` (core imports nothing of ours, and the
platform's policy, attribution and NPD read them across layers); a domain names them.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType

PACKAGE = "gpuvigil.node.checks"
# The modules of `node/checks` itself that are not domain folders.
_REGISTRY_MODULES = frozenset({"domain", "registry"})


@dataclass(frozen=True)
class Domain:
    """What one domain folder declares. `codes` are the core.codes names it owns (each
    code is owned by exactly one domain, `tests/unit/node/test_domains.py`); `also_emits`
    are codes another domain owns that this domain's rules emit too (a lost GPU is seen
    by NVML and in the kernel log alike)."""

    name: str
    summary: str
    codes: tuple[str, ...]
    also_emits: tuple[str, ...] = ()


class DomainError(LookupError):
    """A folder under node/checks that is not a well-formed domain."""


def load_domains(package: str = PACKAGE) -> dict[str, Domain]:
    """Import every domain folder directly under `package` and every module inside it,
    sorted by name so the order of registration (and of `judge`'s findings) does not
    depend on the file system's order. Returns the domains by name."""
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
        for name in modules_of(folder):
            importlib.import_module(name)
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
