"""Tiny inline-SVG charts for the HTML report (no scripts, no external resources).

Called by `observe.html`. Every function returns an `<svg>` string; all text is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

W, H = 640, 220
PAD_L, PAD_R, PAD_T, PAD_B = 56, 16, 14, 34
INK, GRID, ACCENT, BAD, TARGET = "#1f2937", "#e5e7eb", "#2563eb", "#dc2626", "#16a34a"
FONT = 'font-family="system-ui,sans-serif" font-size="11"'


def _text(x: float, y: float, s: str, *, anchor: str = "start", fill: str = INK) -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}">{escape(s)}</text>'


def _frame(body: list[str], *, label: str, height: int = H, width: int = W) -> str:
    return (
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(label)}" {FONT}>' + "".join(body) + "</svg>"
    )


def empty(label: str) -> str:
    return _frame([_text(W / 2, H / 2, "no data in this window", anchor="middle")], label=label)


def line_chart(
    points: Sequence[tuple[float, float]], *, label: str, target: float | None = None
) -> str:
    """Time series of ratios (0..1), y axis zoomed to the data and the target."""
    if not points:
        return empty(label)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    lo = min([*ys, target if target is not None else 1.0])
    lo = max(0.0, min(lo, 1.0) - (1.0 - min(lo, 1.0)) * 0.1 - 1e-4)
    x0, x1 = xs[0], xs[-1] if xs[-1] > xs[0] else xs[0] + 1
    iw, ih = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def px(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * iw

    def py(y: float) -> float:
        return PAD_T + (1.0 - (y - lo) / (1.0 - lo)) * ih

    body = []
    for i in range(5):
        v = lo + (1.0 - lo) * i / 4
        y = py(v)
        body.append(
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>'
        )
        body.append(_text(PAD_L - 4, y + 4, f"{100 * v:.2f}%", anchor="end"))
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        day = datetime.fromtimestamp(x, UTC).strftime("%m-%d %H:%M")
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"  # inside the frame
        body.append(_text(px(x), H - PAD_B + 16, day, anchor=anchor))
    if target is not None and target >= lo:
        y = py(target)
        body.append(
            f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{TARGET}" stroke-dasharray="5 4"/>'
        )
        body.append(
            _text(W - PAD_R, y - 4, f"target {100 * target:.2f}%", anchor="end", fill=TARGET)
        )
    path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
    body.append(f'<polyline points="{path}" fill="none" stroke="{ACCENT}" stroke-width="2"/>')
    for x, y in points:
        if target is not None and y < target:
            body.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{BAD}"/>')
    return _frame(body, label=label)


# Width of one character of the 11 px system-ui labels, rounded up (digits and lower-case
# letters are 5.5-6.5 px in DejaVu Sans and Liberation Sans, the Debian defaults).
CHAR_W = 7.0


def text_width(s: str) -> float:
    return len(s) * CHAR_W


def bar_chart(rows: Sequence[tuple[str, float]], *, label: str, unit: str = "") -> str:
    """Horizontal bars, one per (name, value), largest scale = largest value. The label
    column is as wide as the longest name, and the chart widens to keep the bars' room:
    a name is never cut."""
    if not rows or max(v for _, v in rows) <= 0:
        return empty(label)
    bar, gap = 18, 6
    left = max(60.0, 12 + max(text_width(name) for name, _ in rows))
    width = max(W, round(left + 400))
    height = PAD_T + len(rows) * (bar + gap) + 8
    top = max(v for _, v in rows)
    body = []
    for i, (name, v) in enumerate(rows):
        y = PAD_T + i * (bar + gap)
        w = (width - left - 80) * v / top
        body.append(_text(left - 6, y + bar - 5, name, anchor="end"))
        body.append(f'<rect x="{left:.1f}" y="{y}" width="{w:.1f}" height="{bar}" '
                    f'fill="{ACCENT}"/>')  # fmt: skip
        shown = f"{v:g}{unit}" if unit else f"{v:g}"
        body.append(_text(left + w + 6, y + bar - 5, shown))
    return _frame(body, label=label, height=height, width=width)


def histogram(samples: Sequence[float], *, label: str) -> str:
    """Durations on log-spaced bins (1 s .. days), labelled in s/m/h."""
    if not samples:
        return empty(label)
    edges = [1, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, math.inf]
    names = ["<1s", "1-10s", "10-30s", "30s-1m", "1-5m", "5-15m", "15-30m", "30m-1h", "1-4h",
             "4-12h", "12h-1d", ">1d"]  # fmt: skip
    counts = [0] * len(names)
    for s in samples:
        i = next(k for k, e in enumerate(edges) if s < e)
        counts[i] += 1
    iw, ih = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    top = max(counts)
    bw = iw / len(names)
    body = []
    for i, (name, c) in enumerate(zip(names, counts, strict=True)):
        h = ih * c / top
        x = PAD_L + i * bw
        body.append(
            f'<rect x="{x + 2:.1f}" y="{PAD_T + ih - h:.1f}" width="{bw - 4:.1f}" '
            f'height="{h:.1f}" fill="{ACCENT}"/>'
        )
        body.append(_text(x + bw / 2, H - PAD_B + 16, name, anchor="middle"))
        if c:
            body.append(_text(x + bw / 2, PAD_T + ih - h - 3, str(c), anchor="middle"))
    return _frame(body, label=label)
