"""The "How to add a check" recipe of docs/architecture.md, run for real: a toy health
domain, one new folder under node/checks (here the package's path is extended with a temp
folder) holding its spec, reading, probe and rule, plus one code row, and the sweep judges
the toy check's reading through the pipeline. No list of modules, checks or rules is edited."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuvigil.core import codes
from gpuvigil.core.findings import Status
from gpuvigil.node import checks, sweep
from gpuvigil.node.checks import REGISTRY, CheckContext
from gpuvigil.node.checks.domain import DomainError, load_domains
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline import judge, registry

# node/checks/toy_fan/: the four files of a new domain.
TOY = {
    "__init__.py": '''
        """Health domain `toy_fan`: the fans."""
        from gpuvigil.node.checks.domain import Domain

        DOMAIN = Domain(name="toy_fan", summary="the fans spin", codes=("TOY_FAN_STOPPED",))
    ''',
    "readings.py": '''
        """What the fan probe reads and the fan rule judges."""
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class FanReading:
            rpm: int
    ''',
    "fan.py": '''
        """Probe + check `toy_fan`: the fan's speed, from <root>/fan_rpm."""
        from gpuvigil.node.checks import CheckContext, Readout, check
        from gpuvigil.node.checks.toy_fan.readings import FanReading

        @check("toy_fan", group="fast", interval_s=30, timeout_s=5, description="fan spins")
        def toy_fan(ctx: CheckContext) -> Readout:
            return Readout(readings=(FanReading(int(ctx.path("fan_rpm").read_text())),))
    ''',
    "rules.py": '''
        """Rule `toy_fan`: a stopped fan is a FAILED TOY_FAN_STOPPED."""
        from gpuvigil.core.findings import Finding, Status
        from gpuvigil.node.checks.toy_fan.readings import FanReading
        from gpuvigil.node.pipeline.registry import Inputs, rule

        @rule("toy_fan", reads=FanReading, codes=("TOY_FAN_STOPPED",))
        def toy_fan_rule(reading: FanReading, on: Inputs) -> list[Finding]:
            """A fan at 0 rpm."""
            if reading.rpm > 0:
                return []
            return [Finding(check=on.check, status=Status.FAILED, code="TOY_FAN_STOPPED",
                            message="the fan is stopped")]
    ''',
}


@pytest.fixture
def extra_domains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp folder on node/checks' path; the registries restored afterwards."""
    # Register the real checks and rules first, so restoring the registries afterwards
    # leaves them as other tests expect.
    sweep.load_checks()
    judge.load_rules()
    folder = tmp_path / "domains"
    folder.mkdir()
    monkeypatch.setattr(checks, "__path__", [*checks.__path__, str(folder)])
    monkeypatch.setattr(judge, "_loaded", False)  # rescan node/checks
    saved_checks, saved_rules = dict(REGISTRY), dict(registry.RULES)
    try:
        yield folder
    finally:
        for reg, saved in ((REGISTRY, saved_checks), (registry.RULES, saved_rules)):
            reg.clear()
            reg.update(saved)
        for name in [m for m in sys.modules if m.startswith("gpuvigil.node.checks.toy_")]:
            sys.modules.pop(name)


@pytest.fixture
def toy_domain(extra_domains: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (extra_domains / "toy_fan").mkdir()
    for name, text in TOY.items():
        (extra_domains / "toy_fan" / name).write_text(textwrap.dedent(text))
    # The one row in core/codes.py.
    code = codes.Code("TOY_FAN_STOPPED", codes.GPU_THERMAL, "a fan is stopped")
    monkeypatch.setitem(codes.CODES, code.name, code)


@pytest.mark.usefixtures("toy_domain")
def test_a_toy_domain_is_found_and_judged_without_editing_a_list(tmp_path: Path) -> None:
    (tmp_path / "fan_rpm").write_text("0\n")
    specs = sweep.select(names=["toy_fan"])
    assert [s.name for s in specs] == ["toy_fan"]
    assert judge.load_rules()["toy_fan"].families == (codes.GPU_THERMAL,)
    assert load_domains()["toy_fan"].codes == ("TOY_FAN_STOPPED",)

    ctx = CheckContext(config=NodeConfig(), root=tmp_path, env={"PATH": ""})
    report = sweep.run_sweep(ctx, node="n1", specs=specs)
    assert [(f.check, f.status, f.code) for f in report.findings] == [
        ("toy_fan", Status.FAILED, "TOY_FAN_STOPPED")
    ]

    (tmp_path / "fan_rpm").write_text("2400\n")
    report = sweep.run_sweep(ctx, node="n1", specs=specs)
    assert all(f.code != "TOY_FAN_STOPPED" for f in report.findings)


def test_a_folder_without_a_domain_spec_is_an_error_naming_it(extra_domains: Path) -> None:
    (extra_domains / "toy_nospec").mkdir()
    (extra_domains / "toy_nospec" / "__init__.py").write_text('"""No DOMAIN here."""\n')
    with pytest.raises(DomainError, match=r"node/checks/toy_nospec/.*no DOMAIN"):
        load_domains()
