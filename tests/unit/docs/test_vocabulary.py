"""One vocabulary: every node state, failure cause and metric name that observe/, deploy/ or
docs/ names is one the code really has.

The real ones come from the code: the controller's states (`core.states`), the causes
(`core.exit_codes.FAILURES`), the metric families each layer registers (its
`metrics.build`) and the recording rules in deploy/prometheus/rules.yaml. A name found
where one of those is meant (a PromQL `state`/`cause` matcher, a state word in a sentence
about states, a cause column, a `gpuvigil_*` metric) that is not one of them fails here.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuvigil.core import codes, exit_codes
from gpuvigil.core.events import Kind
from gpuvigil.core.findings import Action, Status
from gpuvigil.core.states import NAMES as STATES

CAUSES = frozenset(c.value for c in exit_codes.FAILURES)
ROOT = Path(__file__).resolve().parents[3]
METRIC_MODULES = ("gpuvigil.node.metrics", "gpuvigil.platform.metrics", "gpuvigil.training.metrics")
# Upper-case words that are neither states nor codes: report headings, InfiniBand port
# states (a port's, not a node's), the prefixes attribution strips from codes.
NOT_NODE_STATES = frozenset({"MTTD", "MTTR", "ETTR", "ACTIVE", "XID_", "SXID_"})
# Every other upper-case vocabulary the code has: codes, actions, statuses, condition
# families. An exit code's name (DRAINED, HANG) is allowed only where exit codes are meant.
OTHER_VOCAB = (
    frozenset(c.name for c in codes._CODES)
    | {a.value for a in Action}
    | {s.value for s in Status}
    | set(codes.FAMILIES)
)
EXIT_NAMES = frozenset(e.name for e in exit_codes.TABLE.values())
SOURCES = sorted(
    [
        *(ROOT / "src/gpuvigil/observe").rglob("*.py"),
        *(p for p in (ROOT / "deploy").rglob("*") if p.is_file()),
        *(ROOT / "docs").glob("*.md"),
        ROOT / "README.md",
    ]
)
MATCHER = re.compile(r'\b(state|cause)\s*(=~|!~|!=|=)\s*\\?"([^"\\]*)')


def metric_names() -> set[str]:
    out: set[str] = set()
    for module in METRIC_MODULES:
        registry = CollectorRegistry()
        importlib.import_module(module).build(registry)
        for names in registry._collector_to_names.values():  # every family's sample names
            out.update(names)
    return out


def recording_rules() -> set[str]:
    text = (ROOT / "deploy/prometheus/rules.yaml").read_text()
    return set(re.findall(r"record:\s*(gpuvigil:[a-z0-9_:]+)", text))


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_the_vocabulary_is_read_from_the_code() -> None:
    assert {"HEALTHY", "SUSPECT", "DRAINING", "REMEDIATING", "VALIDATING", "QUARANTINED"} < STATES
    assert {"DRAINED", "MAINTENANCE", "CORDONED"}.isdisjoint(STATES)
    assert "user_code" in CAUSES and "hardware" in CAUSES
    assert "gpuvigil_nodes_in_service" in metric_names()


def test_promql_state_and_cause_matchers_name_real_ones() -> None:
    bad = []
    for path in SOURCES:
        for m in MATCHER.finditer(path.read_text(errors="replace")):
            real = STATES if m.group(1) == "state" else CAUSES
            for value in filter(None, re.split(r"[|()]", m.group(3))):
                if value not in real and not value.startswith("$"):  # $var: Grafana's
                    bad.append(f"{_rel(path)}: {m.group(1)}{m.group(2)}{value!r}")
    assert not bad, f"not a real {'/'.join(('state', 'cause'))}: {bad}"


def test_sentences_about_states_name_real_states() -> None:
    bad = []
    for path in SOURCES:
        if path.suffix != ".md":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not re.search(r"\bstates?\b", line, re.I):
                continue
            allowed = STATES | OTHER_VOCAB | NOT_NODE_STATES
            if re.search(r"\bexit\b", line, re.I):
                allowed = allowed | EXIT_NAMES
            for word in re.findall(r"`([A-Z][A-Z_]{3,})`", line):
                if word not in allowed and not re.fullmatch(r"S?XID_\d+", word):
                    bad.append(f"{_rel(path)}:{n}: {word}")
    assert not bad, f"state words that are not states: {bad}"


def test_observe_code_names_no_state_of_its_own() -> None:
    """observe/ takes states from core.states; an upper-case literal there is a code, an
    action, a heading, or a real state."""
    bad = []
    allowed = STATES | OTHER_VOCAB | NOT_NODE_STATES
    for path in sorted((ROOT / "src/gpuvigil/observe").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                word = node.value
                if re.fullmatch(r"[A-Z][A-Z_]{3,}", word) and word not in allowed:
                    bad.append(f"{_rel(path)}:{node.lineno}: {word!r}")
    assert not bad, f"state-like literals in observe/ that are not real: {bad}"


def test_cause_columns_and_lists_name_real_causes() -> None:
    bad = []
    for path in SOURCES:
        if path.suffix != ".md":
            continue
        text = path.read_text()
        for listed in re.findall(r"by_cause\{([^}]*)\}", text):
            names = {w.strip() for w in listed.replace("\n", " ").split(",") if w.strip()}
            if names != set(CAUSES) and not names <= set(CAUSES):
                bad.append(f"{_rel(path)}: by_cause{{{listed}}}")
        header: list[str] | None = None
        for line in text.splitlines():
            if not line.startswith("|"):
                header = None
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = [c.lower() for c in cells]
                continue
            if "cause" in header and not set(line) <= set("|-: "):
                cell = cells[header.index("cause")] if len(cells) > header.index("cause") else ""
                word = re.fullmatch(r"`([a-z_]+)`", cell)
                if word and word.group(1) not in CAUSES:
                    bad.append(f"{_rel(path)}: cause {word.group(1)!r}")
    assert not bad, f"not a real attribution cause: {bad}"


def test_metric_names_are_exported_or_recorded() -> None:
    names, rules = metric_names(), recording_rules()
    bad = []
    for path in SOURCES:
        text = path.read_text(errors="replace")
        for w in set(re.findall(r"(?<![\w.-])gpuvigil_[a-z0-9_]+", text)):
            if w not in names and not any(n.startswith(w + "_") for n in names):  # a prefix
                bad.append(f"{_rel(path)}: {w}")
        for w in set(re.findall(r"(?<![\w./:-])gpuvigil:[a-z_][a-z0-9_:]*", text)):
            if w not in rules:
                bad.append(f"{_rel(path)}: {w}")
    assert not bad, f"metrics no layer exports and no rule records: {sorted(bad)}"


@pytest.mark.parametrize("kind", [k.value for k in Kind])
def test_event_kinds_are_documented(kind: str) -> None:
    assert f"`{kind}`" in (ROOT / "docs/events.md").read_text()
