"""The "How to add a check" recipe of docs/architecture.md, run for real: a toy probe
module and a toy rule module dropped into node/probes and node/rules (here their package
paths are extended with a temp folder), one code row, and the sweep judges the toy check's
reading through the pipeline. No list of modules, checks or rules is edited."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuvigil.core import codes
from gpuvigil.core.findings import Status
from gpuvigil.node import probes, readings, rules, sweep
from gpuvigil.node.checks import REGISTRY, CheckContext
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline import judge, registry

PROBE = '''
"""Probe + check `toy_fan`: the fan's speed, from <root>/fan_rpm."""
from gpuvigil.node.checks import CheckContext, Readout, check
from gpuvigil.node.readings import FanReading

@check("toy_fan", group="fast", interval_s=30, timeout_s=5, description="fan spins")
def toy_fan(ctx: CheckContext) -> Readout:
    return Readout(readings=(FanReading(int(ctx.path("fan_rpm").read_text())),))
'''

RULE = '''
"""Rule `toy_fan`: a stopped fan is a FAILED TOY_FAN_STOPPED."""
from gpuvigil.core.findings import Finding, Status
from gpuvigil.node.pipeline.registry import Inputs, rule
from gpuvigil.node.readings import FanReading

@rule("toy_fan", reads=FanReading, codes=("TOY_FAN_STOPPED",))
def toy_fan_rule(reading: FanReading, on: Inputs) -> list[Finding]:
    """A fan at 0 rpm."""
    if reading.rpm > 0:
        return []
    return [Finding(check=on.check, status=Status.FAILED, code="TOY_FAN_STOPPED",
                    message="the fan is stopped")]
'''


@dataclass(frozen=True)
class FanReading:
    """The toy's reading; in the repo, a frozen dataclass in node/readings.py."""

    rpm: int


TOY = ("gpuvigil.node.probes.toy_fan", "gpuvigil.node.rules.toy_fan")


@pytest.fixture
def toy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Register the real checks and rules first, so restoring the registries afterwards
    # leaves them as other tests expect.
    sweep.load_checks()
    judge.load_rules()
    for package, text in ((probes, PROBE), (rules, RULE)):
        folder = tmp_path / package.__name__.rsplit(".", 1)[1]
        folder.mkdir()
        (folder / "toy_fan.py").write_text(textwrap.dedent(text))
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    # The reading in node/readings.py (rules may not import probes) and the row in core/codes.py.
    monkeypatch.setattr(readings, "FanReading", FanReading, raising=False)
    code = codes.Code("TOY_FAN_STOPPED", codes.GPU_THERMAL, "a fan is stopped")
    monkeypatch.setitem(codes.CODES, code.name, code)
    monkeypatch.setattr(judge, "_loaded", False)  # rescan node/rules
    saved_checks, saved_rules = dict(REGISTRY), dict(registry.RULES)
    try:
        yield
    finally:
        for reg, saved in ((REGISTRY, saved_checks), (registry.RULES, saved_rules)):
            reg.clear()
            reg.update(saved)
        for name in TOY:
            sys.modules.pop(name, None)


@pytest.mark.usefixtures("toy_package")
def test_a_toy_check_is_found_and_judged_without_editing_a_list(tmp_path: Path) -> None:
    (tmp_path / "fan_rpm").write_text("0\n")
    specs = sweep.select(names=["toy_fan"])
    assert [s.name for s in specs] == ["toy_fan"]
    assert judge.load_rules()["toy_fan"].families == (codes.GPU_THERMAL,)

    ctx = CheckContext(config=NodeConfig(), root=tmp_path, env={"PATH": ""})
    report = sweep.run_sweep(ctx, node="n1", specs=specs)
    assert [(f.check, f.status, f.code) for f in report.findings] == [
        ("toy_fan", Status.FAILED, "TOY_FAN_STOPPED")
    ]

    (tmp_path / "fan_rpm").write_text("2400\n")
    report = sweep.run_sweep(ctx, node="n1", specs=specs)
    assert all(f.code != "TOY_FAN_STOPPED" for f in report.findings)
