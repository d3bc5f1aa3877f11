"""The one registry of node rules: `@rule(name, reads=Reading, uses=(...), family=...)`.

A rule is a pure function `(reading, inputs) -> list[Finding]`. It declares the reading
type it judges (`reads`), the other facts it may consult (`uses`, each possibly absent)
and the condition family it feeds. `pipeline.judge` calls every rule whose reading is
present; `Inputs.get` refuses a type the rule did not declare, so a declaration can never
drift from what the rule really reads. Imported by the rule modules; imports no rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from gpuvigil.core.findings import Finding

T = TypeVar("T")
RuleFn = Callable[[Any, "Inputs"], list[Finding]]


@dataclass(frozen=True)
class RuleSpec:
    name: str
    reads: type
    uses: tuple[type, ...]
    families: tuple[str, ...]  # the condition families its findings feed
    fn: RuleFn
    description: str = ""


RULES: dict[str, RuleSpec] = {}


def rule(
    name: str, *, reads: type, uses: tuple[type, ...] = (), family: str | tuple[str, ...]
) -> Callable[[RuleFn], RuleFn]:
    families = (family,) if isinstance(family, str) else tuple(family)

    def register(fn: RuleFn) -> RuleFn:
        if name in RULES:
            raise ValueError(f"rule {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        RULES[name] = RuleSpec(name, reads, tuple(uses), families, fn, doc[0] if doc else "")
        return fn

    return register


class UndeclaredInput(LookupError):
    """A rule asked for a fact it did not declare in `uses`."""


class Inputs:
    """What a rule sees besides its reading: `now`, the node config, the name of the
    check its findings belong to, and the facts it declared (latest and previous)."""

    def __init__(
        self,
        spec: RuleSpec,
        *,
        now: datetime,
        config: Any,
        check: str,
        latest: Mapping[type, object],
        previous: Mapping[type, object],
    ) -> None:
        self.spec, self.now, self.config, self.check = spec, now, config, check
        self._latest, self._previous = latest, previous

    def get(self, cls: type[T]) -> T | None:
        if cls not in self.spec.uses:
            raise UndeclaredInput(f"rule {self.spec.name!r} reads {cls.__name__} undeclared")
        value = self._latest.get(cls)
        return value if isinstance(value, cls) else None

    def previous(self) -> Any:
        """The reading of the rule's own type before this one (for rates), or None."""
        value = self._previous.get(self.spec.reads)
        return value if isinstance(value, self.spec.reads) else None
