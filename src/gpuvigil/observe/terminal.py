"""Tables for the terminal that never cut a token, at any width.

Called by every command that prints a table (`check`, `analyze`, `logscan`, `preflight`,
`nodes`, `replay`, `report`, `simulate`, `demo`). Cells wrap at spaces only: an id, a code,
a PCI address or a run name is never split or shortened. Column widths are computed here,
not by rich (which shrinks the widest columns below their longest word): each column
gets at least its longest word. When even that does not fit, the columns are split into
several tables that each repeat the key column; when the key column and one other do not
fit, each row is printed as a block of `header: value` lines. A table that lists only
some rows says how many it left out and how to see the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.progress import TaskID
from rich.table import Table
from rich.text import Text

from gpuvigil.observe.printable import printable

Cell = str | Text  # a str is rich markup (escape() text that is not)
PAD = 2  # each column's padding: one space either side


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"  # left | right
    key: bool = False  # names the row: repeated when the table is split
    wrap: bool = True  # False: a cell is one unit ("30 min"), only the header wraps


def console(*, stderr: bool = False) -> Console:
    """A console at the terminal's width (or $COLUMNS; 80 when neither says), with no
    emoji or highlighting: `:ab:` in a bus id stays text."""
    return Console(stderr=stderr, emoji=False, highlight=False, soft_wrap=False)


def text(cell: Cell) -> Text:
    # emoji=False: ":ab:" in a bus id (0000:ab:00) is text, not an emoji code.
    return cell if isinstance(cell, Text) else Text.from_markup(cell, emoji=False)


def plain(s: str) -> Text:
    """A cell shown as written (no markup, control characters made visible): messages,
    reasons, names, anything that came from an input."""
    return Text(printable(s))


def longest_word(s: str) -> int:
    return max((len(w) for w in s.split()), default=0)


def longest_line(s: str) -> int:
    return max((len(line) for line in s.splitlines()), default=0)


def widths_for(columns: Sequence[Column], rows: Sequence[Sequence[Cell]],
               avail: int) -> list[int] | None:  # fmt: skip
    """Content widths that fit `avail` columns of text without cutting a word, or None.

    Each column gets its longest word, then the space left goes to the columns whose
    text would wrap, in proportion to how much more they want (as browsers lay out tables).
    """
    cells = [[text(c).plain for c in row] for row in rows]
    lo = [max([longest_word(col.header)]
              + [(longest_word if col.wrap else longest_line)(r[i]) for r in cells]) or 1
          for i, col in enumerate(columns)]  # fmt: skip
    hi = [max([longest_line(col.header)] + [longest_line(r[i]) for r in cells]) or 1
          for i, col in enumerate(columns)]  # fmt: skip
    room = avail - sum(lo)
    if room < 0:
        return None
    want = [h - low for h, low in zip(hi, lo, strict=True)]
    if sum(want) <= room:
        return hi
    out = lo[:]
    total = sum(want)
    for i, w in enumerate(want):
        out[i] += room * w // total
    left = avail - sum(out)
    for i in sorted(range(len(out)), key=lambda i: -(hi[i] - out[i])):
        if left <= 0:
            break
        if out[i] < hi[i]:
            out[i] += 1
            left -= 1
    return out


def overhead(n: int) -> int:
    """Border and padding characters of a boxed table of n columns."""
    return (n + 1) + PAD * n


def _table(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], widths: list[int],
           *, title: str | None, caption: str | None) -> RenderableType:  # fmt: skip
    """The table, its title above and caption below as lines of their own (rich would wrap
    them to the table's width, which can be far narrower than the terminal)."""
    t = Table(box=box.HEAVY_HEAD)
    for col, w in zip(columns, widths, strict=True):
        t.add_column(col.header, justify=col.justify, width=w, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        t.add_row(*(text(c) for c in row))
    parts: list[RenderableType] = [Text(title, style="italic")] if title else []
    parts.append(t)
    if caption:
        parts.append(Text(caption, style="dim"))
    return Group(*parts)


def _groups(columns: Sequence[Column], rows: Sequence[Sequence[Cell]],
            width: int) -> list[list[int]] | None:  # fmt: skip
    """Split the non-key columns into runs that fit beside the key columns, or None."""
    keys = [i for i, c in enumerate(columns) if c.key]
    rest = [i for i, c in enumerate(columns) if not c.key]
    groups: list[list[int]] = []
    current: list[int] = []
    for i in rest:
        trial = keys + current + [i]
        if _fits(columns, rows, trial, width):
            current.append(i)
            continue
        if not current:
            return None  # the key and this one column alone do not fit
        groups.append(keys + current)
        current = [i]
        if not _fits(columns, rows, keys + current, width):
            return None
    if current or not groups:
        groups.append(keys + current)
    return groups


def _fits(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], idx: list[int],
          width: int) -> bool:  # fmt: skip
    sub = [columns[i] for i in idx]
    return widths_for(sub, [[r[i] for i in idx] for r in rows], width - overhead(len(idx))) \
        is not None  # fmt: skip


def _blocks(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *,
            title: str | None) -> RenderableType:  # fmt: skip
    """Each row as a block: its key cells on one line, then `header: value` lines."""
    out: list[RenderableType] = []
    if title:
        out.append(Text(title, style="italic"))
    for row in rows:
        head = Text(" ").join(text(row[i]) for i, c in enumerate(columns) if c.key)
        out.append(Text.assemble(head, style="bold"))
        for i, c in enumerate(columns):
            if not c.key and text(row[i]).plain.strip():
                line = Text.assemble(("  " + c.header + ": ", "dim"), text(row[i]))
                out.append(line)
    return Group(*out)


def render(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    *,
    width: int,
    title: str | None = None,
    caption: str | None = None,
) -> RenderableType:
    """The rows as one table, several tables (columns split, key repeated) or blocks,
    whichever is the first that fits `width` without cutting a word."""
    widths = widths_for(columns, rows, width - overhead(len(columns)))
    if widths is not None:
        return _table(columns, rows, widths, title=title, caption=caption)
    groups = _groups(columns, rows, width)
    if groups is None:
        parts: list[RenderableType] = [_blocks(columns, rows, title=title)]
        if caption:
            parts.append(Text(caption))
        return Group(*parts)
    parts = []
    for n, idx in enumerate(groups):
        sub = [columns[i] for i in idx]
        sub_rows = [[r[i] for i in idx] for r in rows]
        w = widths_for(sub, sub_rows, width - overhead(len(idx))) or []
        label = None if title is None else f"{title} ({n + 1}/{len(groups)})"
        last = n == len(groups) - 1
        parts.append(_table(sub, sub_rows, w, title=label, caption=caption if last else None))
    return Group(*parts)


def print_table(
    out: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Cell]],
    *,
    title: str | None = None,
    caption: str | None = None,
    total: int | None = None,
    noun: str = "rows",
    see_all: str = "",
) -> None:
    """Print `rows` (perhaps the first of `total`): when rows were left out, a line says how
    many and how to see all of them (`see_all`, e.g. "--all lists every one")."""
    out.print(render(columns, rows, width=out.width, title=title, caption=caption))
    shown, whole = len(rows), total if total is not None else len(rows)
    if whole > shown:
        hint = f"; {see_all}" if see_all else ""
        out.print(plain(f"showing {shown} of {whole} {noun} ({whole - shown} left out){hint}"))


@contextmanager
def progress(*, quiet: bool = False) -> Iterator[Callable[[str, float | None], None]]:
    """Progress bars on stderr for steps that run one after another: call the yielded
    function with a step's name and its fraction done. Silent when `quiet` (`--json`) or
    when stderr is not a terminal (a pipe, a log file, CI)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = console(stderr=True)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(),
               TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=err, disable=quiet or not err.is_terminal) as bar:
        tasks: dict[str, TaskID] = {}

        def update(name: str, fraction: float | None) -> None:
            """`fraction` None: under way, how far cannot be told (a pulsing bar)."""
            if name not in tasks:
                for done in tasks.values():
                    bar.update(done, total=1.0, completed=1.0)
                tasks[name] = bar.add_task(name, total=None if fraction is None else 1.0)
            if fraction is not None:
                bar.update(tasks[name], total=1.0, completed=min(1.0, max(0.0, fraction)))

        yield update
        for task in tasks.values():
            bar.update(task, total=1.0, completed=1.0)


__all__ = [
    "Cell", "Column", "console", "escape", "plain", "print_table", "printable", "progress",
    "render",
]  # fmt: skip
