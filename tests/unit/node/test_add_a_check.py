"""The "How to add a check" recipe of docs/architecture.md, run for real: a toy health
domain, one new folder under node/checks (here the package's path is extended with a temp
folder) holding its spec, reading, probe, rule, input format and simulator fake, plus one
code row. Every consumer picks it up with no edit: the sweep and the rule registry,
`gpuvigil analyze` (its kind detected, read and judged), docs/checks.md's generated table
and its test, the simulator's layer 1 and `gpuvigil replay`. A consumer that named its
domains would miss the toy, and its assertion here would fail."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuvigil.cli import app
from gpuvigil.core import codes
from gpuvigil.core.events import Event, EventWriter, Kind
from gpuvigil.core.findings import Status
from gpuvigil.node import checks, sweep
from gpuvigil.node.checks import REGISTRY, CheckContext, domain_doc
from gpuvigil.node.checks.domain import DomainError, load_domains
from gpuvigil.node.config import NodeConfig
from gpuvigil.node.pipeline import judge, registry
from gpuvigil.sim import hardware
from gpuvigil.sim import replay as sim_replay
from gpuvigil.sim.detect import Layer1

CHECKS_DOC = Path(__file__).resolve().parents[3] / "docs" / "checks.md"
T0 = datetime(2026, 3, 1, tzinfo=UTC).timestamp()

# node/checks/toy_fan/: the files of a new domain.
TOY = {
    "__init__.py": '''
        """Health domain `toy_fan`: the fans."""
        from gpuvigil.node.checks.domain import Detector, Domain, Format

        DOMAIN = Domain(
            name="toy_fan",
            summary="the fans spin",
            codes=("TOY_FAN_STOPPED",),
            formats=(
                Format("toy-fan", "toy_fan", "toyfanctl status", read="formats:read",
                       detect=(Detector(35, "formats:looks_like"),)),
            ),
            fake="fake:readings",
        )
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
    "formats.py": '''
        """`toyfanctl status` as `gpuvigil analyze` reads it: "fan rpm: N"."""
        from gpuvigil.node.checks.toy_fan.readings import FanReading

        def looks_like(text: str, lines: list[str]) -> bool:
            return bool(lines) and lines[0].startswith("toyfanctl: fan rpm:")

        def read(text: str) -> list[object]:
            return [FanReading(int(text.split("fan rpm:")[1].split()[0]))]
    ''',
    "fake.py": '''
        """The simulator's fan: stopped under the TOY_FAN_STOP fault, else spinning."""
        from gpuvigil.fakes.faulty import FaultyNode, Seen
        from gpuvigil.node.checks.toy_fan.readings import FanReading

        def readings(node: FaultyNode) -> list[Seen]:
            rpm = 0 if node.fault == "TOY_FAN_STOP" else 2400
            return [Seen("toy_fan", (FanReading(rpm),))]
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


@pytest.mark.usefixtures("toy_domain")
def test_every_consumer_picks_up_the_toy_domain(tmp_path: Path) -> None:
    # the registries: the check and the rule, found by the scan
    assert "toy_fan" in {s.name for s in sweep.select(names=["toy_fan"])}
    assert judge.load_rules()["toy_fan"].codes == frozenset({"TOY_FAN_STOPPED"})

    # `gpuvigil analyze`: the toy's kind is detected from the content, read and judged
    stopped, spinning = tmp_path / "fan-a.txt", tmp_path / "fan-b.txt"
    stopped.write_text("toyfanctl: fan rpm: 0\n")
    spinning.write_text("toyfanctl: fan rpm: 2400\n")
    runner = CliRunner()
    out = runner.invoke(app, ["analyze", str(stopped), "--json"])
    assert out.exit_code == 1, out.output
    doc = json.loads(out.stdout)
    assert [i["kind"] for i in doc["inputs"]] == ["toy-fan"]
    assert doc["inputs"][0]["taken_for"] == "toyfanctl status"
    assert [(f["check"], f["status"], f["code"]) for f in doc["findings"]] == [
        ("toy_fan", "FAILED", "TOY_FAN_STOPPED")
    ]
    out = runner.invoke(app, ["analyze", str(spinning), "--json"])
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, ["analyze", "--kind", "toy-fan", str(stopped), "--json"])
    assert out.exit_code == 1, out.output

    # docs/checks.md: the generated table has the toy's row, so the docs test fails until
    # the table is regenerated (`domain_doc --write`), and then documents its check and code
    table = domain_doc.render()
    [row] = [ln for ln in table.splitlines() if ln.startswith("| `toy_fan` |")]
    assert "`toy_fan` (fast, 30 s)" in row and "`toy-fan`" in row
    assert "`TOY_FAN_STOPPED` (GPUThermal)" in row and "| yes |" in row
    assert domain_doc.section(CHECKS_DOC.read_text()) != table
    doc_copy = tmp_path / "checks.md"
    doc_copy.write_text(CHECKS_DOC.read_text())
    assert domain_doc.write(doc_copy)
    assert domain_doc.section(doc_copy.read_text()) == table

    # the simulator: the toy's fake is read and judged for a node with the toy's fault,
    # at the toy check's interval; the other faults' verdicts gain nothing from it
    found = hardware.findings_for("TOY_FAN_STOP", gpu=0)
    assert [(f.check, f.status, f.code) for f in found] == [
        ("toy_fan", Status.FAILED, "TOY_FAN_STOPPED")
    ]
    verdict = Layer1(config=hardware.sim_node_config()).verdict("TOY_FAN_STOP")
    assert verdict.seen and verdict.interval_s == 30
    assert all(f.check != "toy_fan" for f in hardware.findings_for("ECC_UNCORRECTABLE", gpu=3))

    # `gpuvigil replay`: the agent's event for the toy's finding moves the node
    events = tmp_path / "events.jsonl"
    with EventWriter(events) as w:
        for f in found:
            w.write(Event(ts=T0, kind=Kind.FINDING_SET, source="agent", node="n1",
                          data={"code": f.code, "component": f.component,
                                "status": f.status.value, "action": f.action.value,
                                "fatal": f.fatal, "check": f.check}))  # fmt: skip
    r = sim_replay.replay(sim_replay.changes_from_events([events]))
    moved = [d["to"] for d in r.decisions if d["node"] == "n1" and d["kind"] == "node.state"]
    assert moved[:1] == ["SUSPECT"], r.decisions
