"""Slurm configuration text, pure: host lists, `Key=Value` lines, and the rewrite of one
node's lines in gres.conf and in the slurm.conf fragment that defines its `Gres=` count.

Used by the controller's degraded-node procedure (`platform.clusters.slurm_degrade`: take
one GPU's `File` out and lower the count; put both back after the repair), by the Slurm
adapter (`expand_hostlist`) and by the TaskProlog (`node.slurm_taskprolog`: the node's GPU
device files in Slurm's order). Nothing here reads a file or raises on garbage text:
problems come back as `ConfError` from the rewrite functions, which the caller turns into a
drained node with the message as its reason.

How a rewrite is kept reversible and idempotent: the node's lines are first split out of
any shared host-list line (`NodeName=gpu[1-4]` -> `gpu1,gpu3,gpu4` plus a line of its own:
the same configuration), then each line gpuvigil changes gets a marker comment above it,
`# gpuvigil-degraded NODE gpu UUID idx N was: <the line before>`. Degrading again is a
no-op when the marker is there; restoring puts each marked line back as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARK = "# gpuvigil-degraded "
_TOKEN = re.compile(r"""(\S+?)=("[^"]*"|'[^']*'|\S*)""")
_FILE_RANGE = re.compile(r"^(.*?)\[([0-9,\-]+)\](.*)$")


class ConfError(ValueError):
    """The configuration cannot be rewritten as asked (the node or the GPU's file is not
    there, a second GPU is already out, a count that does not parse)."""


def expand_hostlist(text: str) -> list[str]:
    """`gpu[1-3,5],cpu7` -> gpu1 gpu2 gpu3 gpu5 cpu7 (Slurm's compact host lists)."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,\[]*)", text or ""):
        prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
        if not prefix and not ranges:
            continue
        if ranges is None:
            out.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if hi and lo.isdigit() and hi.isdigit():
                out += [f"{prefix}{i:0{len(lo)}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
            elif lo:
                out.append(f"{prefix}{lo}{suffix}")
    return out


def expand_files(spec: str) -> list[str]:
    """gres.conf `File=`: `/dev/nvidia[0-3,5]` or a comma list -> the paths, in order."""
    out: list[str] = []
    for part in re.split(r",(?![^\[]*\])", spec or ""):
        m = _FILE_RANGE.match(part)
        if m is None:
            if part:
                out.append(part)
            continue
        nums = [n[1:] for n in expand_hostlist(f"x[{m.group(2)}]")]  # the range alone
        out += [f"{m.group(1)}{n}{m.group(3)}" for n in nums]
    return out


def compress_files(paths: list[str]) -> str:
    """The inverse of `expand_files`: `/dev/nvidia[0-2,4-7]` when the paths share a stem."""
    m = [re.match(r"^(.*?)(\d+)$", p) for p in paths]
    stems = {x.group(1) for x in m if x}
    if not paths or None in m or len(stems) != 1:
        return ",".join(paths)
    nums = [int(x.group(2)) for x in m if x]
    if len(nums) == 1:
        return paths[0]
    runs: list[str] = []
    start = prev = nums[0]
    for n in [*nums[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(f"{start}" if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return f"{stems.pop()}[{','.join(runs)}]"


def device_number(path: str) -> int | None:
    """`/dev/nvidia3` -> 3 (the character device's minor, NVML's `minor_number`)."""
    m = re.search(r"(\d+)$", path)
    return int(m.group(1)) if m else None


def fields(line: str) -> dict[str, str]:
    """`NodeName=gpu1 Name=gpu File=/dev/nvidia[0-7] # c` -> {key: value} (keys as written;
    look-ups are case-insensitive through `_get`). Comments and blank lines -> {}."""
    body = line.split("#", 1)[0]
    return {m.group(1): m.group(2).strip("\"'") for m in _TOKEN.finditer(body)}


def _get(f: dict[str, str], key: str) -> str | None:
    for k, v in f.items():
        if k.lower() == key.lower():
            return v
    return None


def _set(line: str, key: str, value: str) -> str:
    """`line` with `key`'s value replaced (appended when absent); the rest kept as written."""
    body, sep, comment = line.partition("#")
    pat = re.compile(rf"(^|\s){re.escape(key)}=(\"[^\"]*\"|'[^']*'|\S*)", re.IGNORECASE)
    if pat.search(body):
        body = pat.sub(lambda m: f"{m.group(1)}{key}={value}", body, count=1)
    else:
        body = f"{body.rstrip()} {key}={value}"
    return body + (f" {sep}{comment}" if sep else "")


def _names(line: str) -> list[str]:
    return expand_hostlist(_get(fields(line), "NodeName") or "")


def split_out(text: str, node: str) -> list[str]:
    """The lines of `text` with every line that names `node` among others split in two:
    the others keep the line, and `node` gets the same line for itself right below it."""
    out: list[str] = []
    for line in text.splitlines():
        names = _names(line)
        if node in names and len(names) > 1:
            out.append(_set(line, "NodeName", ",".join(n for n in names if n != node)))
            out.append(_set(line, "NodeName", node))
        else:
            out.append(line)
    return out


@dataclass(frozen=True)
class Degraded:
    """A marker found in a file: which GPU was taken out of which node."""

    node: str
    uuid: str
    index: int


def markers(text: str, node: str | None = None) -> list[Degraded]:
    """The degraded GPUs marked in `text` (of `node`, or of every node)."""
    out = []
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(MARK)}(\S+) gpu (\S+) idx (\d+) was: ", line)
        if m and (node is None or m.group(1) == node):
            out.append(Degraded(m.group(1), m.group(2), int(m.group(3))))
    return out


def _mark(node: str, uuid: str, index: int, was: str) -> str:
    return f"{MARK}{node} gpu {uuid} idx {index} was: {was}"


def _check_marks(text: str, node: str, uuid: str) -> bool:
    """True when this GPU is already out (a repeat); ConfError when another GPU is."""
    found = markers(text, node)
    if any(d.uuid != uuid for d in found):
        other = next(d for d in found if d.uuid != uuid)
        raise ConfError(f"{node} already has GPU {other.uuid} (idx {other.index}) taken out")
    return bool(found)


def node_gpu_files(text: str, node: str) -> list[str]:
    """The node's GPU device files in gres.conf, in the order Slurm numbers them."""
    out: list[str] = []
    for line in text.splitlines():
        f = fields(line)
        if node in _names(line) and (_get(f, "Name") or "").lower() == "gpu":
            out += expand_files(_get(f, "File") or _get(f, "MultipleFiles") or "")
    return out


def degrade_gres(text: str, node: str, *, uuid: str, index: int) -> str:
    """gres.conf without the `File` of GPU `index` on `node` (its `/dev/nvidiaN`), and a
    lower `Count=` on that line where one is written."""
    if _check_marks(text, node, uuid):
        return text
    lines = split_out(text, node)
    for i, line in enumerate(lines):
        f = fields(line)
        if node not in _names(line) or (_get(f, "Name") or "").lower() != "gpu":
            continue
        files = expand_files(_get(f, "File") or "")
        keep = [p for p in files if device_number(p) != index]
        if len(keep) == len(files):
            continue
        new = _set(line, "File", compress_files(keep)) if keep else f"#{line}"
        count = _get(f, "Count")
        if keep and count is not None:
            if not count.isdigit():
                raise ConfError(f"gres.conf Count={count} for {node} is not a number")
            new = _set(new, "Count", str(int(count) - 1))
        lines[i : i + 1] = [_mark(node, uuid, index, line), new]
        return "\n".join(lines) + "\n"
    raise ConfError(f"gres.conf has no gpu File for {node} with device number {index}")


def degrade_count(text: str, node: str, *, uuid: str, index: int) -> str:
    """The slurm.conf fragment with `node`'s `Gres=gpu[:type]:N` one lower."""
    if _check_marks(text, node, uuid):
        return text
    lines = split_out(text, node)
    for i, line in enumerate(lines):
        if _names(line) != [node]:
            continue
        gres = _get(fields(line), "Gres")
        if gres is None:
            raise ConfError(f"the NodeName line of {node} has no Gres=")
        lines[i : i + 1] = [_mark(node, uuid, index, line), _set(line, "Gres", _lower(gres))]
        return "\n".join(lines) + "\n"
    raise ConfError(f"no NodeName line defines {node}")


def _lower(gres: str) -> str:
    """`gpu:8,nic:1` -> `gpu:7,nic:1`; `gpu:h100:8` -> `gpu:h100:7` (one gpu entry only)."""
    parts = gres.split(",")
    gpus = [i for i, p in enumerate(parts) if p.split(":")[0].lower() == "gpu"]
    if len(gpus) != 1:
        raise ConfError(f"Gres={gres}: expected exactly one gpu entry")
    head, _, count = parts[gpus[0]].rpartition(":")
    if not head or not count.isdigit() or int(count) < 1:
        raise ConfError(f"Gres={gres}: the gpu count does not parse")
    parts[gpus[0]] = f"{head}:{int(count) - 1}"
    return ",".join(parts)


def restore(text: str, node: str, *, uuid: str) -> str:
    """Every line marked for this GPU of `node` back as it was before (the split-out lines
    stay split: the same configuration). A no-op when nothing is marked."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(
            rf"^{re.escape(MARK)}{re.escape(node)} gpu {re.escape(uuid)} idx \d+ was: ", line
        )
        if m and i + 1 < len(lines):
            out.append(line[m.end() :])
            i += 2
            continue
        out.append(line)
        i += 1
    return "\n".join(out) + "\n" if out else ""


def gres_count(gres: str) -> int | None:
    """`gpu:7` / `gpu:h100:7(S:0-1)` / `gpu:7,nic:1` -> 7; None when no gpu entry parses
    (scontrol show node's `Gres=`, a NodeName line's `Gres=`)."""
    for part in re.sub(r"\([^)]*\)", "", gres or "").split(","):
        bits = part.split(":")
        if bits[0].lower() == "gpu" and len(bits) >= 2 and bits[-1].isdigit():
            return int(bits[-1])
    return None


def node_count(text: str, node: str) -> int | None:
    """The `Gres=` gpu count the fragment's NodeName line gives `node` (None: not there)."""
    for line in text.splitlines():
        if node in _names(line):
            g = _get(fields(line), "Gres")
            if g is not None:
                return gres_count(g)
    return None
