"""Each health domain (`node/checks/<domain>/`) names the codes it owns in its DOMAIN spec;
the codes themselves are rows in core/codes.py. These keep the two in step: a rule emits
only codes its domain owns or says it shares, and every code a node check can raise has
exactly one owner, so "which folder judges FABRIC_PORT_DOWN?" has one answer."""

from __future__ import annotations

from collections import Counter

from gpuvigil.core import codes
from gpuvigil.node.checks.domain import domain_of, load_domains
from gpuvigil.node.pipeline.judge import load_rules

# Codes no health domain owns: what the check machinery says about any check (could not
# run, disabled), and what other parts emit (analyze's partial inputs, the agent's kept
# state, the training layer's records).
NOT_A_DOMAINS = codes.COULD_NOT_RUN | {
    "CHECK_DISABLED",
    "PARTIAL_INPUT",
    "AGENT_STATE",
    "STRAGGLER",
    "TRAINING_HANG",
}


def test_every_rule_lives_in_a_domain_and_emits_only_its_codes() -> None:
    domains = load_domains()
    for name, spec in load_rules().items():
        domain = domain_of(spec.fn.__module__)
        assert domain in domains, f"rule {name} ({spec.fn.__module__}) is in no domain folder"
        allowed = {*domains[domain].codes, *domains[domain].also_emits}
        assert spec.codes <= allowed, (name, domain, sorted(spec.codes - allowed))


def test_every_node_code_is_owned_by_exactly_one_domain() -> None:
    owners = Counter(c for d in load_domains().values() for c in d.codes)
    assert [c for c, n in owners.items() if n > 1] == []
    unowned = set(codes.CODES) - NOT_A_DOMAINS - set(owners)
    assert unowned == set(), f"codes in core/codes.py no domain owns: {sorted(unowned)}"
    assert set(owners) & NOT_A_DOMAINS == set()


def test_a_domain_names_only_real_codes_and_shares_only_owned_ones() -> None:
    domains = load_domains()
    owned = {c: d.name for d in domains.values() for c in d.codes}
    for d in domains.values():
        assert all(codes.is_known(c) for c in (*d.codes, *d.also_emits)), d.name
        for c in d.also_emits:
            assert owned.get(c) not in (None, d.name), (d.name, c, owned.get(c))
        assert d.summary, d.name


def test_domain_of_names_the_folder() -> None:
    assert domain_of("gpuvigil.node.checks.gpu.rules.memory") == "gpu"
    assert domain_of("gpuvigil.node.checks.pcie") == "pcie"
    assert domain_of("gpuvigil.node.checks.domain") is None
    assert domain_of("gpuvigil.node.checks.registry") is None
    assert domain_of("gpuvigil.node.sweep") is None


def test_every_format_and_fake_a_domain_names_resolves() -> None:
    """A spec names its readers, detectors and fake as "module:function" (so the spec
    imports none of them): each must be a function of that domain's folder."""
    from gpuvigil.node.capture.kinds import kinds

    domains = load_domains()
    for d in domains.values():
        for fmt in d.formats:
            refs = [t.test for t in fmt.detect] + ([fmt.read] if fmt.read else [])
            assert all(callable(d.resolve(r)) for r in refs), (d.name, fmt.kind)
        if d.fake is not None:
            assert callable(d.resolve(d.fake)), d.name
    # the kinds every domain declares, each once (`kinds()` raises on a second)
    assert sum(len(d.formats) for d in domains.values()) == len(kinds())
