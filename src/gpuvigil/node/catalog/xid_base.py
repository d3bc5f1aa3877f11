"""The Xid/SXid catalog's base entries as plain data (`xid_base.json`), for `logscan`.

`logscan` judges each event by the base entries only (it knows no GPU family and takes no
user overrides), and loading the catalog itself costs 0.15 s of start-up (yaml, pydantic,
validating and resolving every code): more than the scan of an ordinary 200 MB log. So
the base entries are resolved once, when the YAML changes, into `xid_base.json` by
`xid.write_base_table()`; a test holds the file equal to `load_catalog()`'s resolution,
so the YAML stays the one source. This module imports neither yaml nor pydantic.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

TABLE = os.path.join(os.path.dirname(__file__), "xid_base.json")


@dataclass(frozen=True, slots=True)
class BaseOutcome:
    """Status and action as their names (Status/Action values), and whether fatal."""

    status: str
    action: str
    fatal: bool


@dataclass(frozen=True, slots=True)
class BaseRule:
    """One code's base entry: what `logscan --json` prints of its verdict."""

    name: str
    known: bool
    outcome: BaseOutcome
    messages: tuple[tuple[re.Pattern[str], BaseOutcome], ...] = ()

    def outcome_for(self, message: str) -> BaseOutcome:
        """The first message rule whose pattern the text matches, else the entry's own
        (as `xid.Rule.outcome_for`)."""
        for pattern, outcome in self.messages:
            if pattern.search(message):
                return outcome
        return self.outcome


class BaseTable:
    """`rule(kind, code)` as `XidCatalog.rule(kind, code)` resolves it, from the file."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data
        self._rules: dict[tuple[str, int], BaseRule] = {}  # built at first use: a log
        # names a few codes, and building all 270 was most of the table's load time

    def rule(self, kind: str, code: int) -> BaseRule:
        hit = self._rules.get((kind, code))
        if hit is None:
            row = self._data[kind].get(str(code)) or self._data["unknown"][kind]
            hit = self._rules[kind, code] = _rule(row)
        return hit


def _rule(row: list[Any]) -> BaseRule:
    name, known, outcome, messages = row
    return BaseRule(
        name=name,
        known=known,
        outcome=BaseOutcome(*outcome),
        messages=tuple((re.compile(p), BaseOutcome(*o)) for p, o in messages),
    )


def load_table() -> BaseTable:
    with open(TABLE, encoding="utf-8") as f:
        return BaseTable(json.load(f))
