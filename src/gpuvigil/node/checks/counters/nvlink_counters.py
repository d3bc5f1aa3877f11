"""NVLink error counters and link states from the tools people paste -> `NvLinkReport`.
Pure; never raises.

- `nvidia-smi nvlink -e`: `GPU 0: <name> (UUID: ...)` then `Link 0: Replay Errors: 0`
  lines (r535+: Replay, Recovery, CRC; older drivers print `CRC FLIT` / `CRC Data`; a
  summary may put several counters on one line, comma-separated).
- `dcgmi nvlink -e -g N`: the box table (`| GPU N |`, `| Link 0 |`, `| -> CRC FLIT Error | 0 |`
  or `| Link 0 | CRC FLIT Error => 0 |`), and its `-j` JSON (`"header": ["NVLINK Error
  Counts", "GPU 0"]`).
- `dcgmi nvlink -s`: `gpuId 0:` (or `physicalId 8:` under `NvSwitches:`) and a row of
  `U`/`D`/`X`/`_` (up, down, disabled, not supported), on the next line or the same one.

Counter names are normalised (`replay`, `recovery`, `crc`, `crc_flit`, `crc_data`, ...);
a value that is not a number (`N/A`) is left out, never read as 0.
"""

from __future__ import annotations

import json
import re

from gpuvigil.node.checks.counters.readings import LinkCounters, LinkOwner, NvLinkReport

MAX_OWNERS = 128
MAX_LINKS = 64

_SMI_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: (GPU-[0-9a-fA-F-]+)\))?\s*$")
_SMI_LINK = re.compile(r"^\s*Link (\d+):\s*(.*?)\s*$")
_PAIR = re.compile(r"([A-Za-z][A-Za-z ]*?)\s*(?::|=>)\s*([^,|]+?)\s*(?:,|$)")
_BOX_GPU = re.compile(r"^\|\s*GPU (\d+)\s*\|?\s*$")
_BOX_ROW = re.compile(r"^\|\s*(?P<left>[^|]*?)\s*\|\s*(?P<right>[^|]*?)\s*\|\s*$")
_OWNER = re.compile(r"^\s*(gpuId|physicalId)\s+(\d+)\s*:\s*(?P<row>[UDX_ ]*?)\s*(?:←.*)?$")
_ROW = re.compile(r"^\s*([UDX_](?:\s+[UDX_])*)\s*$")
_STATES = {"U": "up", "D": "down", "X": "disabled"}


def looks_like(text: str) -> str | None:
    """ "nvidia-smi", "dcgmi" when the text carries that tool's NVLink marks."""
    # `Link 0: Replay Errors: 0`; r570+ `Link 0: Tx Packets: 1, Rx Errors: 0, ...`. Not
    # `-s` (`Link 0: 26.562 GB/s`) nor `-gt d` (`Link 0: Data Tx: 0 KiB`): an error count.
    if re.search(r"^\s*Link \d+:.*\b(?:Errors?|downed)\b[^:,]*:\s*\d", text, re.M):
        return "nvidia-smi"
    if re.search(r"NVLINK Error Counts|NvLink Link Status|^\s*gpuId \d+:\s*[UDX_ ]*$", text, re.M):
        return "dcgmi"
    return None


def parse(text: str) -> NvLinkReport:
    stripped = text.strip()
    if stripped.startswith("{"):
        return _json(stripped)
    if looks_like(text) == "nvidia-smi":
        return _smi(text)
    return _dcgmi(text)


def counter_name(raw: str) -> str:
    words = re.sub(r"\b(?:errors?|counts?)\b", "", raw.lower().replace("->", "")).split()
    return "_".join(words) or "errors"


def _value(raw: str) -> int | None:
    raw = raw.strip()
    return int(raw) if re.fullmatch(r"\d{1,19}", raw) else None


def _unreadable(raw: str) -> bool:
    """Not a count, not N/A and not a rate (Blackwell's `Effective BER: 1.5e-15`)."""
    raw = raw.strip()
    return (
        bool(raw)
        and raw.upper() not in ("N/A", "[N/A]")
        and not re.fullmatch(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\s*%?", raw)
    )


def _smi(text: str) -> NvLinkReport:
    owners: list[tuple[str, str | None, str | None, dict[int, dict[str, int]]]] = []
    problems: list[str] = []
    for line in text.splitlines():
        gm = _SMI_GPU.match(line)
        if gm:
            owners.append((f"gpu:{gm.group(1)}", gm.group(3), gm.group(2).strip(), {}))
            continue
        lm = _SMI_LINK.match(line)
        if lm is None or not owners:
            continue
        for name, raw in _PAIR.findall(lm.group(2)):
            value = _value(raw)
            links = owners[-1][3].setdefault(int(lm.group(1)), {})
            if value is None:
                if _unreadable(raw):
                    problems.append(f"{owners[-1][0]} link {lm.group(1)}: {name} {raw!r}")
                continue
            links[counter_name(name)] = value
    return _report("nvidia-smi nvlink -e", owners, {}, problems)


def _dcgmi(text: str) -> NvLinkReport:
    counts: list[tuple[str, str | None, str | None, dict[int, dict[str, int]]]] = []
    states: dict[str, list[str]] = {}
    problems: list[str] = []
    link: int | None = None
    waiting: str | None = None  # an owner whose row of states is on the next line
    in_switches = False
    for line in text.splitlines():
        if line.strip().startswith("NvSwitches:"):
            in_switches = True
        om = _OWNER.match(line)
        if om:
            kind = "nvswitch" if om.group(1) == "physicalId" or in_switches else "gpu"
            waiting = f"{kind}:{om.group(2)}"
            states[waiting] = []
            if om.group("row").strip():
                states[waiting] = om.group("row").split()
                waiting = None
            continue
        rm = _ROW.match(line)
        if rm and waiting is not None:
            states[waiting] = rm.group(1).split()
            waiting = None
            continue
        gm = _BOX_GPU.match(line.strip())
        if gm:
            counts.append((f"gpu:{gm.group(1)}", None, None, {}))
            link = None
            continue
        bm = _BOX_ROW.match(line.strip())
        if bm is None or not counts:
            continue
        left, right = bm.group("left"), bm.group("right")
        lk = re.fullmatch(r"Link (\d+)", left)
        if lk:
            link = int(lk.group(1))
            counts[-1][3].setdefault(link, {})
            left = ""
        if link is None:
            continue
        # `| -> CRC FLIT Error | 0 |`, or `| Link 0 | CRC FLIT Error => 0 |` continued on
        # `|  | CRC Data Error => 0 |`
        pairs = [(left, right)] if left.startswith("->") else _PAIR.findall(right)
        for name, raw in pairs:
            value = _value(raw)
            if value is None:
                if _unreadable(raw):
                    problems.append(f"{counts[-1][0]} link {link}: {name.strip()} {raw!r}")
                continue
            counts[-1][3][link][counter_name(name)] = value
    source = "dcgmi nvlink -s" if states and not counts else "dcgmi nvlink -e"
    return _report(source, counts, states, problems)


def _json(text: str) -> NvLinkReport:
    try:
        doc = json.loads(text)
        header = [str(h) for h in doc.get("header", [])]
        gpu = re.search(r"GPU (\d+)", " ".join(header))
        body = doc["body"]
        links: dict[int, dict[str, int]] = {}
        problems: list[str] = []
        for key, node in body.items():
            lk = re.fullmatch(r"Link (\d+)", str(key))
            if lk is None or not isinstance(node, dict):
                continue
            for name, leaf in (node.get("children") or {}).items():
                raw = str(leaf.get("value", "")) if isinstance(leaf, dict) else ""
                value = _value(raw)
                if value is None:
                    if _unreadable(raw):
                        problems.append(f"link {lk.group(1)}: {name} {raw!r}")
                    continue
                links.setdefault(int(lk.group(1)), {})[counter_name(name)] = value
        if gpu is None:
            problems.append("no 'GPU n' in the JSON header")
        owner = f"gpu:{gpu.group(1)}" if gpu else "gpu:?"
        return _report("dcgmi nvlink -e -j", [(owner, None, None, links)], {}, problems)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        return NvLinkReport(source="dcgmi nvlink -e -j", problems=(f"not dcgmi JSON: {e}",))


def _report(
    source: str,
    counts: list[tuple[str, str | None, str | None, dict[int, dict[str, int]]]],
    states: dict[str, list[str]],
    problems: list[str],
) -> NvLinkReport:
    owners: list[LinkOwner] = []
    for component, uuid, name, links in counts[:MAX_OWNERS]:
        rows = tuple(
            LinkCounters(link=n, counters=tuple(sorted(c.items())))
            for n, c in sorted(links.items())[:MAX_LINKS]
        )
        owners.append(LinkOwner(component=component, links=rows, uuid=uuid, name=name))
    for component, row in list(states.items())[:MAX_OWNERS]:
        links = tuple(
            LinkCounters(link=i, state=_STATES[s])
            for i, s in enumerate(row[:MAX_LINKS])
            if s != "_"
        )
        owners.append(LinkOwner(component=component, links=links))
    if not owners:
        problems.append(f"{source}: no GPU or link lines")
    return NvLinkReport(source=source, owners=tuple(owners), problems=tuple(problems[:50]))
