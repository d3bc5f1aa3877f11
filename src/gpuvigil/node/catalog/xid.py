"""The Xid/SXid catalog: `xid.yaml` + `sxid.yaml`, validated, merged with user overrides.

Called by the kernel_log check and `gpuvigil analyze` (to build the catalog once from the
config) and by `node.checks.kernel_log.rules.xid` (to look codes up). Vendor knowledge
lives in the YAML files beside this module; this module only validates, merges and resolves
it. An unknown code resolves to FAILED + INVESTIGATE: the catalog fails closed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import ConfigDict, Field, field_validator

from gpuvigil.core.config import StrictModel
from gpuvigil.core.verdicts import Action, Status

FAMILIES = ("volta", "ampere", "hopper", "blackwell")
# NVIDIA: "On Volta and older GPUs" the older catalog applies; Turing predates the
# Ampere-and-newer catalog too. Newer architectures without a block use the base entries.
_FAMILY_ALIASES = {"kepler": "volta", "maxwell": "volta", "pascal": "volta", "turing": "volta"}


class Outcome(StrictModel):
    """What a finding says: its status, the action it calls for, whether to drain now."""

    status: Status
    action: Action = Action.NONE
    fatal: bool = False


class MessageRule(Outcome):
    """An outcome that applies when the event's text matches `match` (a regex)."""

    match: str

    @field_validator("match")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from e
        return v


class Escalation(Outcome):
    """`count` events of the code on one component within `window_s` -> this outcome."""

    count: int = Field(ge=2)
    window_s: float = Field(gt=0)


class Entry(StrictModel):
    """One code. Every field is optional so the same model validates partial overrides."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str | None = None
    description: str | None = None
    bucket: str | None = None  # Xid: NVIDIA's immediate-action bucket (see `buckets`)
    klass: str | None = Field(default=None, alias="class")  # SXid: Fabric Manager class
    status: Status | None = None
    action: Action | None = None
    fatal: bool | None = None
    window_s: float | None = Field(default=None, gt=0)
    only_alone_s: float | None = Field(default=None, gt=0)  # ignore unless alone on its GPU
    escalate: Escalation | None = None
    messages: tuple[MessageRule, ...] | None = None
    source: str | None = None
    # Confined to the GPU it names (xid.yaml header): per-GPU isolation may apply.
    device_local: bool | None = None


class FamilyBlock(StrictModel):
    boot_noise: tuple[int, ...] = ()
    xid: dict[int, Entry] = Field(default_factory=dict)


class XidFile(StrictModel):
    schema_version: int = 1
    default_window_s: float = Field(default=3600, gt=0)
    buckets: dict[str, Outcome] = Field(default_factory=dict)
    boot_noise_window_s: float = Field(default=600, ge=0)
    families: dict[str, FamilyBlock] = Field(default_factory=dict)
    xid: dict[int, Entry] = Field(default_factory=dict)


class SxidFile(StrictModel):
    schema_version: int = 1
    classes: dict[str, Outcome] = Field(default_factory=dict)
    sxid: dict[int, Entry] = Field(default_factory=dict)


class CatalogOverrides(StrictModel):
    """The user's changes, from `node.kernel_log` in the config (fields merge per code)."""

    default_window_s: float | None = Field(default=None, gt=0)
    boot_noise_window_s: float | None = Field(default=None, ge=0)
    buckets: dict[str, Outcome] = Field(default_factory=dict)
    xid: dict[int, Entry] = Field(default_factory=dict)
    sxid: dict[int, Entry] = Field(default_factory=dict)
    families: dict[str, FamilyBlock] = Field(default_factory=dict)


_CATALOG_FIELDS = frozenset(CatalogOverrides.model_fields)


@dataclass(frozen=True)
class Rule:
    """A code resolved for one family: everything the rules need, nothing to look up."""

    kind: str  # "xid" | "sxid"
    code: int
    name: str
    description: str
    known: bool
    outcome: Outcome
    window_s: float
    only_alone_s: float | None = None
    escalate: Escalation | None = None
    messages: tuple[tuple[re.Pattern[str], Outcome], ...] = ()
    source: str = ""
    device_local: bool = False  # confined to its GPU (per-GPU isolation may apply)

    def outcome_for(self, message: str) -> Outcome:
        """The outcome for one event's text: the first matching message rule, else the
        entry's outcome."""
        for pattern, outcome in self.messages:
            if pattern.search(message):
                return outcome
        return self.outcome


class CatalogError(ValueError):
    """The catalog (shipped or overridden) is inconsistent; names the code and the field."""


class XidCatalog:
    """The merged catalog. Build with `load_catalog(overrides)`; immutable afterwards."""

    def __init__(self, xid: XidFile, sxid: SxidFile) -> None:
        self._xid, self._sxid = xid, sxid
        self.boot_noise_window_s = xid.boot_noise_window_s
        self._cache: dict[tuple[str, int, str | None], Rule] = {}
        # Resolve everything once so a bad bucket/class or boot-noise code fails at load.
        for code in xid.xid:
            for fam in (None, *xid.families):
                self.rule("xid", code, fam)
        for fam, block in xid.families.items():
            for code in block.xid:
                self.rule("xid", code, fam)
            for code in block.boot_noise:
                if self.rule("xid", code, fam).outcome.fatal:
                    raise CatalogError(
                        f"families.{fam}.boot_noise: Xid {code} is fatal; only non-fatal "
                        "codes may be ignored as boot noise"
                    )
        for code in sxid.sxid:
            self.rule("sxid", code)

    def rule(self, kind: str, code: int, family: str | None = None) -> Rule:
        fam = family_key(family)
        key = (kind, code, fam)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._resolve(kind, code, fam)
        return hit

    def boot_noise(self, family: str | None) -> frozenset[int]:
        block = self._xid.families.get(family_key(family) or "")
        return frozenset(block.boot_noise) if block else frozenset()

    def codes(self, kind: str) -> list[int]:
        return sorted(self._xid.xid if kind == "xid" else self._sxid.sxid)

    def device_local(self, family: str | None = None) -> frozenset[int]:
        """The Xid codes confined to the GPU they name, for `family` (None: the base
        entries). SXids are the NVSwitch's: never device-local."""
        block = self._xid.families.get(family_key(family) or "")
        codes = set(self._xid.xid) | (set(block.xid) if block else set())
        return frozenset(c for c in codes if self.rule("xid", c, family).device_local)

    def _resolve(self, kind: str, code: int, fam: str | None) -> Rule:
        if kind == "xid":
            entry = self._xid.xid.get(code)
            block = self._xid.families.get(fam or "")
            patch = block.xid.get(code) if block else None
            if patch is not None:
                entry = _merge(entry, patch)
            table, key, where = self._xid.buckets, entry.bucket if entry else None, "bucket"
        else:
            entry = self._sxid.sxid.get(code)
            table, key, where = self._sxid.classes, entry.klass if entry else None, "class"
        label = f"{kind}.{code}"
        if entry is None:
            return _unknown(kind, code, self._xid.default_window_s)
        base = None
        if key is not None:
            base = table.get(key)
            if base is None:
                raise CatalogError(f"{label}: unknown {where} {key!r}")
        status = entry.status or (base.status if base else None)
        if status is None:
            raise CatalogError(f"{label}: needs a {where} or a status")
        outcome = Outcome(
            status=status,
            action=entry.action or (base.action if base else Action.NONE),
            fatal=entry.fatal if entry.fatal is not None else (base.fatal if base else False),
        )
        return Rule(
            kind=kind,
            code=code,
            name=entry.name or "",
            description=entry.description or "",
            known=True,
            outcome=outcome,
            window_s=entry.window_s or self._xid.default_window_s,
            only_alone_s=entry.only_alone_s,
            escalate=entry.escalate,
            messages=tuple(
                (re.compile(m.match), Outcome(status=m.status, action=m.action, fatal=m.fatal))
                for m in entry.messages or ()
            ),
            source=entry.source or "",
            device_local=bool(entry.device_local) and kind == "xid",
        )


def family_key(family: str | None) -> str | None:
    if not family:
        return None
    f = family.strip().lower()
    return _FAMILY_ALIASES.get(f, f)


def _merge(base: Entry | None, patch: Entry) -> Entry:
    data: dict[str, Any] = base.model_dump(exclude_unset=True, by_alias=True) if base else {}
    data.update(patch.model_dump(exclude_unset=True, by_alias=True))
    return Entry.model_validate(data)


def _unknown(kind: str, code: int, window_s: float) -> Rule:
    return Rule(
        kind=kind,
        code=code,
        name="UNKNOWN",
        description=f"{kind.upper()} {code} is not in gpuvigil's catalog",
        known=False,
        outcome=Outcome(status=Status.FAILED, action=Action.INVESTIGATE),
        window_s=window_s,
    )


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 10x faster start-up


def _read(name: str) -> dict[str, Any]:
    text = resources.files("gpuvigil.node.catalog").joinpath(name).read_text(encoding="utf-8")
    data = yaml.load(text, Loader=_LOADER)  # a safe loader (C when available)
    if not isinstance(data, dict):
        raise CatalogError(f"{name}: the top level must be a mapping")
    return data


@lru_cache(maxsize=1)
def _shipped() -> tuple[XidFile, SxidFile]:
    return XidFile.model_validate(_read("xid.yaml")), SxidFile.model_validate(_read("sxid.yaml"))


def load_catalog(overrides: CatalogOverrides | None = None) -> XidCatalog:
    """The shipped catalog with the user's overrides merged in, per code and field.

    Raises CatalogError (a ValueError) naming the code when the result is inconsistent.
    """
    xid, sxid = _shipped()
    if overrides is None or not (overrides.model_fields_set & _CATALOG_FIELDS):
        return _default_catalog()
    xdata = xid.model_dump(exclude_unset=True, by_alias=True)
    sdata = sxid.model_dump(exclude_unset=True, by_alias=True)
    if overrides.default_window_s is not None:
        xdata["default_window_s"] = overrides.default_window_s
    if overrides.boot_noise_window_s is not None:
        xdata["boot_noise_window_s"] = overrides.boot_noise_window_s
    xdata.setdefault("buckets", {}).update(
        {k: v.model_dump() for k, v in overrides.buckets.items()}
    )
    _merge_codes(xdata.setdefault("xid", {}), overrides.xid)
    _merge_codes(sdata.setdefault("sxid", {}), overrides.sxid)
    fams = xdata.setdefault("families", {})
    for fam, block in overrides.families.items():
        key = family_key(fam) or fam
        cur = fams.setdefault(key, {})
        if "boot_noise" in block.model_fields_set:
            cur["boot_noise"] = list(block.boot_noise)
        _merge_codes(cur.setdefault("xid", {}), block.xid)
    return XidCatalog(XidFile.model_validate(xdata), SxidFile.model_validate(sdata))


def _merge_codes(into: dict[int, Any], patches: dict[int, Entry]) -> None:
    for code, patch in patches.items():
        cur = dict(into.get(code) or {})
        cur.update(patch.model_dump(exclude_unset=True, by_alias=True))
        into[code] = cur


@lru_cache(maxsize=1)
def _default_catalog() -> XidCatalog:
    xid, sxid = _shipped()
    return XidCatalog(xid, sxid)


def base_table(catalog: XidCatalog | None = None) -> dict[str, Any]:
    """The shipped catalog's base entries (no family, no overrides) as `xid_base.json`
    holds them: per kind, code -> [name, known, outcome, [[pattern, outcome], ...]], each
    outcome [status, action, fatal]; `unknown` is what a code not in the catalog gets."""
    cat = catalog if catalog is not None else load_catalog()

    def row(rule: Rule) -> list[Any]:
        return [rule.name, rule.known, _outcome_row(rule.outcome),
                [[p.pattern, _outcome_row(o)] for p, o in rule.messages]]  # fmt: skip

    out: dict[str, Any] = {
        kind: {str(code): row(cat.rule(kind, code)) for code in cat.codes(kind)}
        for kind in ("xid", "sxid")
    }
    out["unknown"] = {kind: row(_unknown(kind, -1, 1.0)) for kind in ("xid", "sxid")}
    return out


def _outcome_row(o: Outcome) -> list[Any]:
    return [o.status.value, o.action.value, o.fatal]


def write_base_table() -> None:
    """Regenerate `xid_base.json` (after editing xid.yaml or sxid.yaml)."""
    from gpuvigil.node.catalog.xid_base import TABLE

    table = base_table()
    with open(TABLE, "w", encoding="utf-8") as f:  # one code a line: diffs stay readable
        f.write("{\n")
        for i, (kind, rows) in enumerate(table.items()):
            f.write(f'"{kind}": {{\n')
            f.write(",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in rows.items()))
            f.write("\n}" + (",\n" if i < len(table) - 1 else "\n}\n"))
