"""Filtered and excerpted `nvidia-smi -q` text, read for what it holds. Pure; never raises.

`nvidia-smi -q -d ECC -i 3` prints `Attached GPUs : 8` and one GPU block holding only the
ECC sections; `nvidia-smi -q | grep -A 8 "Remapped Rows"` keeps one section and no GPU line
at all. Read as a whole `-q`, the first looks cut short (8 attached, 1 described: could
not tell) and pins GPU 3's findings on gpu:0; the second is not recognised. Here:

- the GPU a block belongs to comes from `-i N` on the pasted command line, else from its
  place in bus order when every attached GPU is printed; a block that cannot be placed is
  named by its bus id (`gpu:00000000:3B:00.0`), and a section with no GPU line at all by
  `gpu:?`;
- the sections the lines hold decide which checks were made; the others are listed as not
  made (a `PARTIAL_INPUT` note), never passed;
- each GPU's `Fabric` section (State/Status) is read for every `-q` text, whole or not;
- an excerpt that starts inside the clock-reasons section (its `HW Slowdown : Not Active`
  lines without the `Clocks Event Reasons` title) is given that title back.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime

from gpuvigil.core.findings import utcnow
from gpuvigil.node.checks.fabric_manager.readings import FabricRegistration, GpuFabricStates
from gpuvigil.node.checks.gpu import nvidia_smi, nvidia_smi_errors, nvidia_smi_text
from gpuvigil.node.checks.gpu.readings import (
    GpuInventory,
    GpuReading,
    PartialGpuInventory,
    ReadError,
)

SOURCE = "nvidia-smi -q (partial)"
# What each GPU check reads, by the -q sections (lower case) that carry it.
CHECKS: dict[str, tuple[str, ...]] = {
    "ECC error counts": ("ecc errors",),
    "ECC mode": ("ecc mode",),
    "retired pages": ("retired pages",),
    "row remapping": ("remapped rows",),
    "temperature": ("temperature",),
    "clock events (thermal, power brake)": ("clocks event reasons", "clocks throttle reasons"),
    "PCIe link": ("pci",),
    "fabric registration": ("fabric",),
    "recovery action": ("gpu reset status", "gpu recovery action"),
}
_SECTION_NAMES = {s for names in CHECKS.values() for s in names}
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w ./()-]*?)\s*(?::\s*(?P<value>.*?))?\s*$")
_CMD = re.compile(r"nvidia-smi[ \t]+(?P<args>-[^\n|;&>]*)")  # to the end of the command
_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$", re.M)
# The bus id of a stand-in GPU block for sections pasted without their `GPU <bus id>` line
# (`-q | grep -A 4 "Remapped Rows"`): one per repetition of the first section's title.
_STAND_IN = re.compile(r"^FFFF(?P<k>[0-9A-F]{4}):FF:FF\.0$")


# The clock-reason keys (`-q`'s words, r470-r580), for an excerpt cut inside that section.
_REASON_KEYS = frozenset(
    {
        "idle",
        "sw power cap",
        "hw slowdown",
        "hw thermal slowdown",
        "hw power brake slowdown",
        "sw thermal slowdown",
        "sync boost",
        "display clock setting",
        "applications clocks setting",
    }
)
_REASON = re.compile(r"^(?P<indent> +)(?P<key>[A-Za-z][\w ]*?)\s*:\s*(?:Not )?Active\s*$")


def _titled(text: str) -> str:
    """`text` with the clock-reasons title put back above reason lines that start it."""
    lines = text.splitlines()
    head = [ln for ln in lines if ln.strip()][:1]
    m = _REASON.match(head[0]) if head else None
    if m is None or m.group("key").lower() not in _REASON_KEYS:
        return text
    indent = max(len(m.group("indent")) - 8, 4)  # the title sits 4-8 columns left of them
    return f"{' ' * indent}Clocks Event Reasons\n{text}"


def sections_of(text: str) -> tuple[str, ...]:
    """The known -q sections the text holds, in order."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        m = _KEY.match(line)
        if m and 0 < len(m.group("indent")) <= 8 and m.group("key").lower() in _SECTION_NAMES:
            seen[m.group("key").lower()] = None
    return tuple(seen)


def looks_like_excerpt(lines: list[str]) -> bool:
    """A section of `-q` (e.g. `    Remapped Rows` then `        Pending : No`) without the
    `NVSMI LOG` header: a section title, then deeper `Key : Value` lines."""
    first = _REASON.match(lines[0]) if lines else None
    if first is not None and first.group("key").lower() in _REASON_KEYS:
        return True  # cut inside the clock-reasons section
    for i, line in enumerate(lines[:400]):
        m = _KEY.match(line)
        if not m or m.group("key").lower() not in _SECTION_NAMES or m.group("value"):
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        sub = _KEY.match(nxt)
        if (
            sub
            and sub.group("value") is not None
            and len(sub.group("indent")) > len(m.group("indent"))
            and re.search(r"\S\s+:\s", nxt)
        ):
            return True
    return False


def is_partial(text: str) -> bool:
    args = _command_args(text)
    if args and re.search(r"(?:^|\s)(?:-d|--display(?:=|\s)|-i|--id(?:=|\s))", args):
        return True
    if not nvidia_smi_text.looks_like_text(text):
        return True  # an excerpt without the NVSMI LOG header
    blocks = re.split(r"^GPU\s+[0-9A-Fa-f]{4,8}:", text, flags=re.M)[1:]
    return any("Product Name" not in b for b in blocks)


def _command_args(text: str) -> str | None:
    m = _CMD.search(text)
    return m.group("args").strip() if m else None


def _ids(args: str | None) -> list[int] | None:
    m = re.search(r"(?:-i|--id)(?:=|\s*)([\d,]+)\b", args or "")
    return [int(x) for x in m.group(1).split(",") if x] if m else None


def parse(text: str, *, observed_at: datetime | None = None) -> PartialGpuInventory:
    args = _command_args(text)
    text = _titled(text)
    body = text if _GPU.search(text) else _with_stand_ins(text)
    errors: list[ReadError] = []
    gpus: list[GpuReading] = []
    attached: int | None = None
    driver: str | None = None
    try:
        root = nvidia_smi_text.to_xml(body)
        raw = root.findtext("attached_gpus") or ""
        attached = int(raw) if raw.strip().isdigit() else None
        driver = root.findtext("driver_version")
        for i, el in enumerate(root.findall("gpu")):
            gpus.append(nvidia_smi.gpu_from_xml(i, el))
    except Exception as e:  # noqa: BLE001 - never raise on input
        errors.append(ReadError("text", "Unparsable", f"{type(e).__name__}: {e}"))
    said = nvidia_smi_errors.scan(text)
    if said.driver is not None:
        errors.append(said.driver)
    gpus, unnamed = _placed(gpus, _ids(args), attached)
    known = {g.pci_bus_id for g in gpus}
    gpus += [g for g in said.lost if g.pci_bus_id not in known]
    held = sections_of(text)
    missing = tuple(c for c, need in CHECKS.items() if not any(s in held for s in need))
    inv = GpuInventory(
        source=SOURCE,
        observed_at=observed_at or utcnow(),
        gpus=tuple(gpus),
        count=attached,
        driver_version=driver,
        errors=tuple(errors),
    )
    return PartialGpuInventory(
        inventory=inv,
        sections=held,
        not_checked=missing,
        command=f"nvidia-smi {args}" if args else None,
        unnamed=tuple(unnamed),
    )


def _placed(
    gpus: list[GpuReading], ids: list[int] | None, attached: int | None
) -> tuple[list[GpuReading], list[tuple[int, str]]]:
    """Each block's GPU index, or a negative stand-in (with its bus id) when unknown."""
    stand_ins = sum(1 for g in gpus if _STAND_IN.match(g.pci_bus_id or ""))
    labels: dict[int, str] = {}
    for i, g in enumerate(gpus):
        m = _STAND_IN.match(g.pci_bus_id or "")
        if m:
            labels[i] = "?" if stand_ins == 1 else f"?{int(m.group('k'), 16)}"
            gpus[i] = replace(g, pci_bus_id=None)
    if ids is not None and len(ids) == len(gpus):
        # Indexes follow bus order (nvidia-smi's default enumeration): pair them so.
        ordered = sorted(gpus, key=lambda g: g.pci_bus_id or "")
        return [replace(g, index=i) for g, i in zip(ordered, sorted(ids), strict=True)], []
    if attached is not None and len(gpus) == attached and all(g.pci_bus_id for g in gpus):
        ordered = sorted(gpus, key=lambda g: g.pci_bus_id or "")
        return [replace(g, index=i) for i, g in enumerate(ordered)], []
    unnamed = [(-(i + 1), g.pci_bus_id or labels.get(i, "?")) for i, g in enumerate(gpus)]
    return [replace(g, index=k) for g, (k, _) in zip(gpus, unnamed, strict=True)], unnamed


def _with_stand_ins(text: str) -> str:
    """Sections without GPU lines, each repetition of the first section title a GPU."""
    lines = text.splitlines()
    first: tuple[int, str] | None = None
    out: list[str] = []
    k = 0
    for line in lines:
        m = _KEY.match(line)
        title = (
            (len(m.group("indent")), m.group("key").lower())
            if m and not m.group("value") and m.group("key").lower() in _SECTION_NAMES
            else None
        )
        if title is not None and first is None:
            first = title
        if title is not None and title == first:
            k += 1
            out.append(f"GPU FFFF{k:04X}:FF:FF.0")
        out.append(line)
    if k == 0:
        out.insert(0, "GPU FFFF0001:FF:FF.0")
    return "\n".join(out)


def fabric_states(text: str, gpus: tuple[GpuReading, ...] = ()) -> GpuFabricStates | None:
    """Each GPU block's Fabric State/Status, or None when no block has a Fabric section."""
    by_bus = {g.pci_bus_id: g.index for g in gpus if g.pci_bus_id}
    if not _GPU.search(text):
        text = _with_stand_ins(text)  # sections without GPU lines: one stand-in each
    out: list[FabricRegistration] = []
    bus: str | None = None
    block = -1
    in_fabric: int | None = None  # the indent of the open Fabric section
    current: dict[str, str] = {}

    def close() -> None:
        if in_fabric is not None:
            index = by_bus.get(bus or "", -(block + 1) if block >= 0 else -1)
            out.append(FabricRegistration(index, bus, current.get("state"), current.get("status")))

    for line in text.splitlines():
        g = _GPU.match(line)
        if g:
            close()
            in_fabric, current, block = None, {}, block + 1
            bus = None if _STAND_IN.match(g.group(1).upper()) else g.group(1).upper()
            continue
        m = _KEY.match(line)
        if m is None:
            continue
        indent, key = len(m.group("indent")), m.group("key").lower()
        if in_fabric is not None and indent <= in_fabric:
            close()
            in_fabric, current = None, {}
        if key == "fabric" and not m.group("value"):
            in_fabric, current = indent, {}
        elif in_fabric is not None and key in ("state", "status") and m.group("value"):
            current[key] = m.group("value")
    close()
    return GpuFabricStates(gpus=tuple(out)) if out else None
