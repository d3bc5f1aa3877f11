"""docs/checks.md documents every finding code in core/codes.py and every registered check,
and its table of domains is what the domain specs generate (`node.checks.domain_doc`)."""

from pathlib import Path

from gpuvigil.core import codes
from gpuvigil.node import sweep
from gpuvigil.node.checks import REGISTRY, domain_doc

DOC = Path(__file__).resolve().parents[3] / "docs" / "checks.md"
REGENERATE = "PYTHONPATH=src python -m gpuvigil.node.checks.domain_doc --write docs/checks.md"


def undocumented_codes(text: str) -> list[str]:
    return [c for c in codes.CODES if f"`{c}`" not in text]


def undocumented_checks(text: str) -> list[str]:
    """Checks neither in the hand-written checks table nor in the generated domain table."""
    sweep.load_checks()
    rows = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| `")}
    generated = domain_doc.section(text) or ""
    return [n for n in REGISTRY if f"`{n}`" not in rows and f"`{n}` (" not in generated]


def test_every_code_is_documented() -> None:
    text = DOC.read_text()
    missing = undocumented_codes(text)
    assert not missing, f"codes missing from docs/checks.md: {missing}"
    assert "`XID_<n>`" in text and "`SXID_<n>`" in text


def test_every_check_is_documented() -> None:
    missing = undocumented_checks(DOC.read_text())
    assert not missing, f"checks missing from docs/checks.md: {missing}"


def test_the_domain_table_is_what_the_specs_generate() -> None:
    written = domain_doc.section(DOC.read_text())
    assert written is not None, "docs/checks.md lost its generated domain table markers"
    assert written == domain_doc.render(), f"docs/checks.md is stale: run `{REGENERATE}`"
