"""Import every module of a package, so whatever registers itself on import (checks under
`node/probes`, rules under `node/rules`) is registered without a hand-kept list of modules
that a new file can be missing from."""

from __future__ import annotations

import importlib
import pkgutil


def import_all(package: str) -> tuple[str, ...]:
    """Import `package` and each module directly under it, sorted by name so the order of
    registration (and of `judge`'s findings) does not depend on the file system's order.
    Returns the names imported."""
    pkg = importlib.import_module(package)
    names = tuple(sorted(f"{package}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)))
    for name in names:
        importlib.import_module(name)
    return names
