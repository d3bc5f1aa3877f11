"""The demo's HTML report in headless Chromium at 1280 px: every label whole, the same
figures as the terminal table.

A copy of the page gets a probe script (the report itself carries none) that measures, in
the browser's own layout: every SVG text inside its chart's frame, no panel, card or cell
that overflows (text cut or scrolled away), and every token the report keeps whole on one
line. A page with a label pushed out of its chart proves the probe can fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from gpuvigil.observe import svg
from gpuvigil.sim import demo

pytestmark = pytest.mark.realparts

PROBE = """<script>
const bad = [];
for (const s of document.querySelectorAll('svg')) {
  const vb = s.viewBox.baseVal;
  for (const t of s.querySelectorAll('text')) {
    const b = t.getBBox();
    const out = b.x < -0.5 || b.x + b.width > vb.width + 0.5
      || b.y < -0.5 || b.y + b.height > vb.height + 0.5;
    if (out) bad.push('svg text cut: ' + t.textContent);
  }
}
for (const e of document.querySelectorAll('.panel, .card, td, th, h1, h2, .sub, .note'))
  if (e.scrollWidth > e.clientWidth + 1) bad.push('overflows: ' + e.textContent.slice(0, 60));
for (const k of document.querySelectorAll('.k'))
  if (k.getClientRects().length > 1) bad.push('token split: ' + k.textContent);
const out = document.createElement('pre');
out.id = 'probe';
out.textContent = JSON.stringify(bad);
document.body.appendChild(out);
</script>"""


def probe(chromium, page: Path, tmp: Path, *, shot: Path | None = None) -> list[str]:
    copy = tmp / f"probe-{page.name}"
    copy.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    result = chromium.render(copy, screenshot=shot, window="1280,3000")
    m = re.search(r'<pre id="probe">(.*?)</pre>', result.dom, re.S)
    assert m, "the probe did not run"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("demo")
    report = tmp / "demo.html"
    console = Console(width=200, record=True)
    import gpuvigil.sim.cli as sim_cli

    original = sim_cli.print_results
    sim_cli.print_results = lambda results, **_: original(results, out=console)  # type: ignore[assignment]
    try:
        demo.run(nodes=160, days=12, seed=1, report=report, events=None)
    finally:
        sim_cli.print_results = original  # type: ignore[assignment]
    return report, console.export_text()


def test_every_label_whole_at_1280px(demo_page, chromium, tmp_path: Path) -> None:
    page, _ = demo_page
    shot = tmp_path / "demo-1280.png"
    assert probe(chromium, page, tmp_path, shot=shot) == []
    assert shot.exists() and shot.stat().st_size > 50_000
    assert "of node-" in page.read_text()  # the GPU chart has labels to measure


def test_a_long_label_widens_its_chart(chromium, tmp_path: Path) -> None:
    rows = [("pci:0000:00:00.0 of gpu-node-0017.rack-42.cluster.example", 3.0), ("gpu:1", 1.0)]
    page = tmp_path / "long.html"
    page.write_text(f"<!DOCTYPE html><html><body>{svg.bar_chart(rows, label='x')}</body></html>")
    assert probe(chromium, page, tmp_path) == []


def test_the_html_shows_the_tables_figures(demo_page) -> None:
    """Each row of each terminal table (the comparison, what each run did) is a row of
    the HTML's tables, the same numbers written the same way."""
    page, table = demo_page
    html = page.read_text().replace('<span class="k">', "").replace("</span>", "")
    checked = 0
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) > 5 and cells[0] in ("baseline", "full", "driver-storm-no-breaker"):
            rows = re.findall(rf"<tr><td>{re.escape(cells[0])}</td>.*?</tr>", html)
            shown = [re.findall(r"<td[^>]*>([^<]*)</td>", row)[1:] for row in rows]
            assert cells[1:] in shown, (cells, shown)
            checked += 1
    assert checked >= 3


def test_the_probe_finds_a_cut_label(chromium, tmp_path: Path) -> None:
    cut = svg._frame([svg._text(-40, 20, "node-00017 is cut")], label="x")
    long_cell = '<table style="width:80px;table-layout:fixed"><tr><td>' + "x" * 80 + "</td></tr>"
    page = tmp_path / "bad.html"
    page.write_text(f"<!DOCTYPE html><html><body>{cut}{long_cell}</table></body></html>")
    bad = probe(chromium, page, tmp_path)
    assert any("node-00017" in b for b in bad) and any("overflows" in b for b in bad), bad
