"""The one registry of node rules: `@rule(name, reads=Reading, uses=(...), codes=(...))`.

A rule is a pure function `(reading, inputs) -> list[Finding]`. It declares the reading
type it judges (`reads`), the other facts it may consult (`uses`, each possibly absent)
and the codes it emits (`codes`, besides the could-not-judge ones every rule may emit).
The condition families it feeds are derived from those codes' families in `core.codes`,
the one place a family is declared, so the two cannot drift. `pipeline.judge` calls every
rule whose reading is present; `Inputs.get` refuses a type the rule did not declare, so a
declaration can never drift from what the rule really reads. Imported by the rule modules;
imports no rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from gpuvigil.core.codes import FAMILIES, declares, family_of, is_known
from gpuvigil.core.findings import Finding

T = TypeVar("T")
RuleFn = Callable[[Any, "Inputs"], list[Finding]]


@dataclass(frozen=True)
class RuleSpec:
    name: str
    reads: type
    uses: tuple[type, ...]
    codes: frozenset[str]  # what it emits besides core.codes.COULD_NOT_RUN
    fn: RuleFn
    description: str = ""

    @property
    def families(self) -> tuple[str, ...]:
        """The condition families its findings feed: its codes', in `FAMILIES` order."""
        own = {family_of(c) for c in self.codes}
        return tuple(f for f in FAMILIES if f in own)

    def emits(self, code: str) -> bool:
        return declares(self.codes, code)


RULES: dict[str, RuleSpec] = {}


def rule(
    name: str, *, reads: type, uses: tuple[type, ...] = (), codes: tuple[str, ...]
) -> Callable[[RuleFn], RuleFn]:
    # A typo'd or unlisted code would give the rule a family nobody declared: refuse it
    # at import, where the rule's module is loaded.
    unknown = [c for c in codes if not is_known(c)]
    if not codes or unknown:
        raise ValueError(f"rule {name!r}: codes must be non-empty and in core.codes: {unknown}")

    def register(fn: RuleFn) -> RuleFn:
        if name in RULES:
            raise ValueError(f"rule {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        spec = RuleSpec(name, reads, tuple(uses), frozenset(codes), fn, doc[0] if doc else "")
        RULES[name] = spec
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
