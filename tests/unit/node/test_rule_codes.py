"""A rule's family is declared once, on its codes in core.codes: `@rule` takes the codes a
rule emits, never a family, and every finding a rule emits over the simulator's faults
carries a code it declared (so the family derived from the declaration is the finding's)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator

import pytest

from gpuvigil.core import codes
from gpuvigil.core.findings import Finding
from gpuvigil.fakes.faults import Fault
from gpuvigil.node.checks.kernel_log import fake as kernel_log_fake
from gpuvigil.node.pipeline import registry
from gpuvigil.node.pipeline.judge import load_rules
from gpuvigil.sim import hardware


def test_a_rule_declares_codes_and_no_family() -> None:
    assert "family" not in inspect.signature(registry.rule).parameters
    fields = {f.name for f in dataclasses.fields(registry.RuleSpec)}
    assert "family" not in fields and "families" not in fields  # derived, never stored
    for spec in load_rules().values():
        derived = {codes.family_of(c) for c in spec.codes}
        assert set(spec.families) == derived and spec.families, spec.name
        assert all(codes.is_known(c) for c in spec.codes), spec.name


# The rules whose codes span families, measured on the code when families became derived:
# each reads one source that reports several kinds of fault (the kernel log, the topology
# matrix). Every other rule feeds one family (the GPU rules were split so). A rule that
# comes to span families by accident fails here; one that does on purpose says so here.
SPANS_FAMILIES = {
    # GPU_XID since the GSP timeout banner without its Xid line reads as Xid 119's event.
    "driver_faults": (codes.GPU_XID, codes.GPU_INTERCONNECT, codes.HEALTH_CHECK),
    "topology": (codes.GPU_INTERCONNECT, codes.NETWORK_FABRIC, codes.HEALTH_CHECK),
    "xid": (codes.GPU_XID, codes.GPU_INTERCONNECT),
}


def test_a_rule_feeds_one_family_unless_it_says_otherwise() -> None:
    spanning = {n: s.families for n, s in load_rules().items() if len(s.families) > 1}
    assert spanning == SPANS_FAMILIES


def test_an_unknown_code_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="NOT_A_CODE"):
        registry.rule("test_typo", reads=int, codes=("NOT_A_CODE",))
    with pytest.raises(ValueError):
        registry.rule("test_none", reads=int, codes=())


def test_declares_covers_open_ended_and_could_not_run_codes() -> None:
    xid_rule = frozenset({codes.ANY_XID})
    assert codes.declares(xid_rule, "XID_79") and not codes.declares(xid_rule, "SXID_12")
    assert codes.declares(frozenset({"PCIE_DEGRADED"}), "CHECK_ERROR")
    assert not codes.declares(frozenset({"PCIE_DEGRADED"}), "NVLINK_DOWN")


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Finding]]]:
    """Every (rule, finding) the registered rules produce while the fixture is live."""
    seen: list[tuple[str, Finding]] = []
    for name, spec in list(load_rules().items()):

        def fn(reading: object, on: registry.Inputs, _spec: registry.RuleSpec = spec):
            out = _spec.fn(reading, on)
            seen.extend((_spec.name, f) for f in out)
            return out

        monkeypatch.setitem(registry.RULES, name, dataclasses.replace(spec, fn=fn))
    yield seen


# The fake hardware's faults, and the Xid-only ones the simulator draws (a fatal and a
# non-fatal Xid besides).
# (DRIVER_UNAVAILABLE stops NVML before any rule reads; the simulator never asks for it.)
FAULTS = (
    [f.value for f in Fault if f is not Fault.DRIVER_UNAVAILABLE]
    + sorted(kernel_log_fake.XID_ONLY)
    + ["XID_79", "XID_43"]
)


@pytest.mark.parametrize("fault", FAULTS)
def test_every_finding_a_rule_emits_is_a_code_it_declared(
    fault: str, emitted: list[tuple[str, Finding]]
) -> None:
    hardware.findings_for(fault, gpu=3)
    undeclared = {(n, f.code) for n, f in emitted if not registry.RULES[n].emits(f.code)}
    assert undeclared == set()


def test_the_wrapper_sees_what_the_rules_emit(emitted: list[tuple[str, Finding]]) -> None:
    hardware.findings_for("ecc_uncorrectable", gpu=3)  # else the test above would pass on nothing
    assert ("gpu_memory", "ECC_UNCORRECTED_VOLATILE") in {(n, f.code) for n, f in emitted}
