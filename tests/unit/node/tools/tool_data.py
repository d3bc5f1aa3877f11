"""The real outputs the pasted-tool tests read: data/ (verbatim public outputs, cited in
test_tool_outputs.py) and excerpts of the shared corpus (read from ../shared/corpus, never
copied here)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "data"

# (corpus file, first line, last line): one section of a real `-q` (leptonai/gpud testdata).
REMAPPED_ROWS = ("q_a10_535.129.03_remap-pending_gpud.txt", 139, 149)  # Pending: Yes
FABRIC = ("q_h100x8_535.183.01_gpud.txt", 208, 210)  # Completed / Success


def real(name: str) -> str:
    return (DATA / name).read_text()


def corpus_excerpt(corpus: Path, name: str, first: int, last: int) -> str:
    """Lines first..last of a corpus nvidia-smi file, as `grep -A` would keep them."""
    lines = (corpus / "nvidia_smi" / name).read_text().splitlines(keepends=True)
    return "".join(lines[first - 1 : last])
