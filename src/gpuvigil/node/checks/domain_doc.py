"""docs/checks.md's table of health domains, generated from their specs: for each domain
folder, what it judges, the checks it registers, the kinds `analyze` reads with it, whether
the simulator fakes its readings (`DOMAIN.fake`) and the codes it owns. A new domain's row
appears with no hand edit:

    python -m gpuvigil.node.checks.domain_doc --write docs/checks.md

rewrites the part between the markers; `tests/unit/docs/test_checks_doc.py` fails while
docs/checks.md differs from what the specs say.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuvigil.core import codes
from gpuvigil.node.checks.domain import domain_of, load_domains

BEGIN = (
    "<!-- BEGIN domains: generated from node/checks/*/__init__.py by "
    "`python -m gpuvigil.node.checks.domain_doc --write docs/checks.md`; do not edit -->"
)
END = "<!-- END domains -->"


def render() -> str:
    """The generated table, markers included."""
    from gpuvigil.node.checks.registry import REGISTRY

    domains = load_domains()  # registers every check, so REGISTRY is whole
    by_domain: dict[str, list[str]] = {}
    for spec in REGISTRY.values():
        owner = domain_of(spec.fn.__module__)
        if owner is not None:
            by_domain.setdefault(owner, []).append(
                f"`{spec.name}` ({spec.group}, {spec.interval_s:g} s)"
            )
    lines = [
        BEGIN,
        "",
        "| domain | what it judges | checks | reads (`analyze --kind`) | simulated "
        "| codes it owns |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for d in domains.values():
        kinds = ", ".join(f"`{f.kind}`" for f in d.formats) or "-"
        owned = ", ".join(f"`{c}` ({codes.family_of(c)})" for c in d.codes)
        if d.also_emits:
            owned += "; also emits " + ", ".join(f"`{c}`" for c in d.also_emits)
        checks = ", ".join(by_domain.get(d.name, [])) or "-"
        summary = " ".join(d.summary.split()).replace("|", "\\|")
        sim = "yes" if d.fake else "-"
        lines.append(f"| `{d.name}` | {summary} | {checks} | {kinds} | {sim} | {owned} |")
    return "\n".join([*lines, "", END])


def section(text: str) -> str | None:
    """The generated part of a docs/checks.md text, markers included (None: absent)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start : end + len(END)]


def write(path: Path) -> bool:
    """Rewrite the generated part of `path`; True when it changed."""
    text = path.read_text()
    old = section(text)
    if old is None:
        raise SystemExit(f"{path}: no {BEGIN!r} ... {END!r} markers")
    new = render()
    if old == new:
        return False
    path.write_text(text.replace(old, new))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="rewrite this docs/checks.md in place")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(render() + "\n")
        return 0
    changed = write(args.write)
    sys.stdout.write(f"{args.write}: {'rewritten' if changed else 'already up to date'}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
