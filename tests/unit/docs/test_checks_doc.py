"""docs/checks.md documents every finding code in core/codes.py and every registered check."""

from pathlib import Path

from gpuvigil.core import codes
from gpuvigil.node import sweep
from gpuvigil.node.checks import REGISTRY

DOC = Path(__file__).resolve().parents[3] / "docs" / "checks.md"


def test_every_code_is_documented() -> None:
    text = DOC.read_text()
    missing = [c for c in codes.CODES if f"`{c}`" not in text]
    assert not missing, f"codes missing from docs/checks.md: {missing}"
    assert "`XID_<n>`" in text and "`SXID_<n>`" in text


def test_every_check_is_documented() -> None:
    sweep.load_checks()
    text = DOC.read_text()
    rows = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| `")}
    missing = [name for name in REGISTRY if f"`{name}`" not in rows]
    assert not missing, f"checks missing from docs/checks.md: {missing}"
