"""`nvidia-smi nvlink -s` (`--status`) -> per-GPU NVLink link states. Pure, never raises.

One block per GPU: `GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)`, then `Link 0: 25 GB/s`
(up, at that speed) or `Link 3: <inactive>` (down). A GPU whose links are all down prints
`NVML: Unable to retrieve NVLink information as all links are inActive` instead: every
link the product has (the GPU catalog) is down; a PCIe card prints the same and has none.
The NVLink rules then judge these readings as they judge NVML's (`rules.nvlink`).
A pasted excerpt may elide the UUID (`(UUID: ...)`) or links (a `...` line): a GPU cut
that way, with every link shown up, says nothing of the links not shown (never "down").
"""

from __future__ import annotations

import re
from datetime import datetime

from gpuvigil.core.findings import utcnow
from gpuvigil.node.catalog import gpus as gpu_catalog
from gpuvigil.node.checks.gpu import nvidia_smi_errors
from gpuvigil.node.checks.gpu.readings import GpuInventory, GpuReading, NvLinkReading, ReadError

SOURCE = "nvidia-smi nvlink"
GPU_LINE = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?\s*$")
# A paste's elision mark on a line of its own: `...`, `....`, `[...]`, `…`.
_ELISION = re.compile(r"^\s*(?:\.{3,}|\[\s*\.{3}\s*\]|…)\s*$")
_LINK = re.compile(r"^\s+Link (\d+): (.*?)\s*$")
_SPEED = re.compile(r"^\d+(?:\.\d+)?\s*[GM]B/s$", re.I)
_ALL_INACTIVE = "all links are inactive"
_COUNTER = re.compile(r"^[a-z][a-z ]*errors?\s*:", re.I)


def parse_nvlink_status(text: str | bytes, *, observed_at: datetime | None = None) -> GpuInventory:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    catalog = gpu_catalog.load()
    blocks: list[tuple[int, str, str | None, list[NvLinkReading], bool]] = []
    elided: set[int] = set()  # blocks a `...` cut: their unlisted links are unknown, not down
    errors: list[ReadError] = []
    other = 0  # link lines that are not a state (`nvlink -gt d` counters look alike)
    for line in text.splitlines():
        gm = GPU_LINE.match(line)
        if gm:
            uuid = gm.group(3) if gm.group(3) and gm.group(3).startswith("GPU-") else None
            blocks.append((int(gm.group(1)), gm.group(2).strip(), uuid, [], False))
            continue
        if not blocks:
            continue
        if _ELISION.match(line):
            elided.add(len(blocks) - 1)
            continue
        lm = _LINK.match(line)
        if lm:
            state = lm.group(2).lower()
            if "inactive" in state or state in ("down", "<down>"):
                blocks[-1][3].append(NvLinkReading(link=int(lm.group(1)), active=False))
            elif _SPEED.match(state):
                blocks[-1][3].append(NvLinkReading(link=int(lm.group(1)), active=True))
            elif _COUNTER.match(state):
                pass  # an `nvlink -e` line pasted with `-s`: read by probes.nvlink_counters
            else:
                other += 1
        elif _ALL_INACTIVE in line.lower():
            index, name, uuid, links, _ = blocks[-1]
            blocks[-1] = (index, name, uuid, links, True)
    gpus: list[GpuReading] = []
    for at, (index, name, uuid, read, all_inactive) in enumerate(
        blocks[: nvidia_smi_errors.MAX_GPUS + 1]
    ):
        product = catalog.lookup(name)
        links = read
        if at in elided and all(link.active for link in read):
            links = []  # only some links shown, all up: the rest are not known to be down
        if all_inactive and product is not None and product.nvlinks:
            links = [NvLinkReading(link=i, active=False) for i in range(product.nvlinks)]
        gpus.append(
            GpuReading(
                index=index,
                name=name,
                uuid=uuid,
                architecture=product.family if product else None,
                nvlinks=tuple(links),
            )
        )
    gpus = nvidia_smi_errors.capped(gpus, errors)
    said = nvidia_smi_errors.scan(text)
    if other:
        errors.append(
            ReadError("nvlink", "Unparsable", f"{other} link line(s) are not a link state")
        )
    if said.driver is not None:
        errors.append(said.driver)
    elif not gpus and not said.no_devices:
        errors.append(ReadError("nvlink", "Unparsable", "no 'GPU n: <name>' lines"))
    return GpuInventory(
        source=SOURCE,
        observed_at=observed_at or utcnow(),
        gpus=tuple(gpus),
        count=len(gpus) if gpus or said.no_devices else None,
        errors=tuple(errors),
    )
