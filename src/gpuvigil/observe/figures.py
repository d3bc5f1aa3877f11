"""Named figures with units: how every number of a run is labelled and written, once.

A figure is declared where it is computed, on its dataclass field:

    mttd_s: float = figure(0.0, "MTTD", SECONDS, "mean time from a fault's onset to ...")

and every view reads it from there: the terminal table (`simulate`, `demo`, `report`),
the JSON (the field's own name and raw value, in base units) and the HTML report all use
the same label, the same unit and `show()`, the one formatter. A field added without a
declaration still reaches every view (labelled with its name, its unit read from the
name: `_s` seconds, `_rate` a ratio), so a new number never needs code in each view.

`measure` says whose number it is: TRUTH (the simulator knows every fault's onset and
repair) or LOGGED (layer 4 computed it from the event log, as it would in production:
it only sees what was reported). A view that shows both says which is which.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

RATIO, SECONDS, COUNT, GPU_HOURS, NUMBER = "ratio", "seconds", "count", "GPU-hours", "number"
TRUTH, LOGGED = "truth", "logged"
MEASURES = {
    TRUTH: "what happened in the simulated fleet (the simulator knows every fault's onset "
    "and repair)",
    LOGGED: "what layer 4 computes from the run's event log, as it would in production "
    "(it sees only what was reported)",
}


@dataclass(frozen=True)
class Spec:
    label: str  # what every view calls it
    unit: str  # RATIO | SECONDS | COUNT | GPU_HOURS | NUMBER
    about: str = ""  # one sentence: what it counts (the table's legend, the HTML's tooltip)
    measure: str = TRUTH
    # Which terminal table shows it: 1 the comparison, 2 what each run did; 0 only --json
    # and the HTML report (they show every figure).
    table: int = 0
    digits: int = 1  # decimals of a ratio shown as a percentage


@dataclass(frozen=True)
class Figure:
    key: str  # the JSON name
    spec: Spec
    value: Any

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def text(self) -> str:
        return show(self.value, self.spec)


def figure(default: Any, label: str, unit: str, about: str = "", **kw: Any) -> Any:
    """A dataclass field that is a figure (keyword arguments: the rest of `Spec`)."""
    spec = Spec(label, unit, about, **kw)
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=type(default), metadata={"figure": spec})
    return dataclasses.field(default=default, metadata={"figure": spec})


# The terminal tables by `Spec.table`, with their titles (the comparison has the run's).
TABLES = {1: "", 2: "what each run did"}

# Metadata of a numeric field that is a setting of the run, not a figure (nodes, seed).
SETTING: dict[str, Any] = {"figure": None}


def guess(key: str, value: Any) -> Spec:
    """The spec of a number added without one: its name says its unit."""
    label = key.replace("_", " ")
    if key.endswith(("_s", "_seconds")):
        return Spec(label.removesuffix(" s").removesuffix(" seconds"), SECONDS)
    if key.endswith(("_rate", "_ratio")) or key in ("availability", "goodput"):
        return Spec(label, RATIO, digits=2)
    if "gpu_hours" in key:
        return Spec(label, GPU_HOURS)
    return Spec(label, COUNT if isinstance(value, int) else NUMBER)


def figures_of(obj: Any, *, measure: str | None = None) -> list[Figure]:
    """Every number of a dataclass instance, declared or not, in field order."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if "figure" in f.metadata and f.metadata["figure"] is None:
            continue  # a setting
        spec = f.metadata.get("figure")
        if spec is None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # names, dicts, flags: not figures
            spec = guess(f.name, value)
        if measure is not None and spec.measure != measure:
            spec = dataclasses.replace(spec, measure=measure)
        out.append(Figure(f.name, spec, value))
    return out


def duration(s: float | None) -> str:
    """Seconds for people: 34 s, 18 min, 10.5 h, 3.2 d."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s < 120:
        return f"{s:.1f} s" if s < 10 and s != int(s) else f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 4 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def percent(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def show(value: Any, spec: Spec) -> str:
    """The one way a figure is written, in every view."""
    if value is None:
        return "-"
    if spec.unit == RATIO:
        return percent(value, spec.digits)
    if spec.unit == SECONDS:
        return duration(value)
    if spec.unit == COUNT:
        return f"{value:,}" if isinstance(value, int) else f"{value:,.0f}"
    if spec.unit == GPU_HOURS:
        return f"{value:,.0f}"
    return f"{value:,.4g}" if isinstance(value, float) else str(value)
