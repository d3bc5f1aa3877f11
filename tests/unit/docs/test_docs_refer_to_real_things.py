"""Every path and command the docs and `--help` name exists.

Scanned: README.md, docs/*.md and the help text of every command. A repository path
(`deploy/…`, `examples/…`, `src/gpuvigil/…`, `bench/…`) must exist; an installed program
(`/usr/local/bin/X`, `/usr/local/sbin/X`) must be gpuvigil itself or a file shipped under
deploy/; every `gpuvigil SUBCOMMAND --flag` must name a real subcommand and its real
options; every `make TARGET` a Makefile target. (The Slurm wrapper was
/usr/local/bin/gpuvigil-slurm-healthcheck in `--help` and /usr/local/sbin/gpuvigil-healthcheck
in the docs, and neither shipped.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuvigil import cli

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REPO_PATH = re.compile(
    r"(?<![\w/.~-])((?:deploy|examples|bench|docs|scripts|tests|src/gpuvigil|gpuvigil)/"
    r"[\w./-]*[\w/])"
)
INSTALLED = re.compile(r"/usr/local/s?bin/([\w.-]+)")
COMMAND = re.compile(
    r"(?<![\w/-])(?<!-n )(?<!from )gpuvigil ([a-z][a-z-]+)(?=[\s`]|$)((?: +[^\s`|;&)'\"<>]+)*)"
)
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)  # fenced blocks and inline code
EXAMPLE = re.compile(r"(?:Example|Examples|Try it[^:]*|slurm\.conf):\s*(.+?)(?:\n\n|$)", re.S)
MAKE = re.compile(r"(?<![\w-])make ([a-z][a-z-]*)")
NOT_PATHS = ("gpuvigil/v1", "gpuvigil/report")  # format names, not files


def texts() -> list[tuple[str, str]]:
    out = [(p.name, p.read_text()) for p in PAGES]
    out += [(f"gpuvigil {name} --help", cli.load(name).help or "") for name in cli.COMMANDS]
    out.append(("gpuvigil --help", cli.HELP))
    return out


def test_repository_paths_exist() -> None:
    missing = []
    for where, text in texts():
        for m in REPO_PATH.finditer(text):
            line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
            if "kubectl" in line:
                continue  # deploy/NAME there is a Kubernetes object
            path = m.group(1).split("#")[0].rstrip(".")
            if path.startswith(NOT_PATHS):
                continue
            target = ROOT / "src" / path if path.startswith("gpuvigil/") else ROOT / path
            if not target.exists():
                missing.append(f"{where}: {path}")
    assert not missing, missing


def test_installed_programs_are_shipped() -> None:
    shipped = {p.name for p in (ROOT / "deploy").rglob("*") if p.is_file()} | {"gpuvigil"}
    named: dict[str, set[str]] = {}
    for where, text in texts():
        for m in INSTALLED.finditer(text):
            named.setdefault(m.group(0), set()).add(where)
    unknown = {path: sorted(w) for path, w in named.items() if Path(path).name not in shipped}
    assert not unknown, f"named but not shipped under deploy/: {unknown}"


def options_of(name: str) -> set[str]:
    command = cli.load(name)
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def code(where: str, text: str) -> str:
    """What is meant to be typed: code in a page; examples and literal lines in a help."""
    if where.endswith(".md"):
        return "\n".join(m.group(0) for m in CODE.finditer(text))
    lines = [ln for ln in text.splitlines() if ln.startswith(cli.LITERAL)]
    return "\n".join([*lines, *(m.group(1) for m in EXAMPLE.finditer(text))])


def test_commands_and_their_flags_exist() -> None:
    known = {name: options_of(name) | {"-h", "--help"} for name in cli.COMMANDS}
    wrong = []
    for where, text in texts():
        for m in COMMAND.finditer(code(where, text)):
            sub, rest = m.group(1), m.group(2)
            if sub not in known:  # prose or a log line unless it carries a flag
                if sub != "version" and re.search(r"(?<![\w-])--[a-z]", rest):
                    wrong.append(f"{where}: gpuvigil {sub}")
                continue
            for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
                if flag not in known[sub]:
                    wrong.append(f"{where}: gpuvigil {sub} {flag}")
    assert not wrong, wrong


def test_make_targets_exist() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    wrong = [f"{w}: make {t}" for w, text in texts() for t in MAKE.findall(code(w, text))
             if t not in targets]  # fmt: skip
    assert not wrong, wrong


@pytest.mark.parametrize(
    "text", ["see deploy/nope/x.yaml", "`gpuvigil nope --json`", "`gpuvigil check --nope`"]
)
def test_the_checks_catch_a_made_up_reference(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.texts", lambda: [("fake.md", text)])
    with pytest.raises(AssertionError):
        test_repository_paths_exist()
        test_commands_and_their_flags_exist()


def test_the_state_file_age_is_stated_once() -> None:
    """Every page that gives the state file's age limit gives the one default
    (core.freshness.STATE_FILE_MAX_AGE_S); npd-plugin, slurm-healthcheck and the training
    health gate used to say 180, 120 and 600 s."""
    from gpuvigil.core.freshness import STATE_FILE_MAX_AGE_S

    said = []
    for where, text in texts():
        for para in text.split("\n\n"):
            if re.search(r"state.file|max.age|health gate", para, re.I):
                limits = re.findall(r"(?:max.age\w*`?|older than)\D{0,40}?(\d+) s\b", para)
                said += [(where, int(n)) for n in limits]
    assert said and all(n == STATE_FILE_MAX_AGE_S for _, n in said), said
    assert ("agent.md", int(STATE_FILE_MAX_AGE_S)) in said
