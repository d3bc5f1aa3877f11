"""The faults `gpuvigil lab --fault KIND` injects, and what each does to a machine.

GPU faults change the machine's fake hardware the way the fault shows up to NVML
(`gpuvigil.fakes.faults`) and print the driver's Xid line into its kernel log, so both of
the agent's Xid sources see it. The job's ranks compute on the CPU, so a GPU fault reaches
the job only through the platform (a drain), not as a CUDA error.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from gpuvigil.fakes import faults as fake_faults
from gpuvigil.fakes.gpu import FakeXid
from gpuvigil.lab.machine import Machine


@dataclass(frozen=True)
class FaultKind:
    name: str
    summary: str
    expect: str  # how the lab run should end (the docs' table and the tests say the same)
    gpu_fault: bool = True
    ends_node: bool = False  # the node (or its GPU) leaves the lab for good: run it last
    # One GPU's fault (GPU-local in the catalog, and the device plugin marks the GPU
    # Unhealthy): the job's pods leave a GPU of their node to a holder pod, whose GPU the
    # fault hits, so the run shows the holder evicted and the job on the other GPUs running on.
    per_gpu: bool = False


KINDS = {
    k.name: k
    for k in (
        FaultKind("xid48", "Xid 48: a double-bit ECC error (a GPU reset cures it)",
                  "drained, RESET_GPU, preflight, back in service; no REBOOT"),
        FaultKind("xid79", "Xid 79: the GPU fell off the bus (a reboot cures it)",
                  "drained, REBOOT (a new boot id), preflight, back in service"),
        FaultKind("row-remap-failure", "a row remap failed (no spare rows): replace the GPU",
                  "only that GPU leaves service: its holder pod evicted, the GPU isolated "
                  "until replaced; the node is never cordoned, the job runs on",
                  ends_node=True, per_gpu=True),
        FaultKind("rank-hang", "one rank stops making progress (its process is stopped)",
                  "the hang watchdog ends the step, the job restarts; no node is blocked",
                  gpu_fault=False),
        FaultKind("agent-stop", "the node's agent dies (SIGKILL); its kubelet restarts it "
                  "later", "blocked while its health is unknown, never drained; back in "
                  "service once the agent reports again", gpu_fault=False),
    )
}  # fmt: skip


def order_problem(kinds: list[str]) -> str | None:
    """Why `kinds` cannot run in this order on one lab, or None."""
    if not kinds:
        return "no fault given"
    for kind in kinds:
        if kind not in KINDS:
            return f"unknown fault {kind!r}; one of {', '.join(KINDS)}"
    ends = [k for k in kinds[:-1] if KINDS[k].ends_node]
    if ends:
        return f"{ends[0]} takes its GPU or node out of the lab for good: give it last"
    return None


def _xid_line(machine: Machine, gpu: int, code: int, text: str) -> str:
    bus = machine.fake_node().gpu(gpu).pci_bus_id  # NVML's 00000000:18:00.0
    pci = bus[4:14]  # as the driver prints it: 0000:18:00
    return machine.log_kernel(f"NVRM: Xid (PCI:{pci}): {code}, pid='<unknown>', "
                              f"name=<unknown>, {text}")  # fmt: skip


def xid48(machine: Machine, gpu: int) -> str:
    node = machine.fake_node()
    g = node.gpu(gpu)
    g.ecc_volatile_uncorrected += 1
    g.ecc_aggregate_uncorrected += 1
    g.xids.append(FakeXid(48))
    machine.save(node)
    return _xid_line(machine, gpu, 48, "double bit ECC error in the framebuffer (lab fault).")


def xid79(machine: Machine, gpu: int) -> str:
    node = fake_faults.apply(machine.fake_node(), fake_faults.Fault.GPU_OFF_BUS, gpu=gpu)
    machine.save(node)
    return _xid_line(machine, gpu, 79, "GPU has fallen off the bus.")


def row_remap_failure(machine: Machine, gpu: int) -> str:
    node = fake_faults.apply(machine.fake_node(), fake_faults.Fault.ROW_REMAP_FAILURE, gpu=gpu)
    machine.save(node)
    return _xid_line(machine, gpu, 64, "row remapping failed: no spare rows (lab fault).")


GPU_FAULTS: dict[str, Callable[[Machine, int], str]] = {
    "xid48": xid48,
    "xid79": xid79,
    "row-remap-failure": row_remap_failure,
}


def stop_process(pid: int) -> None:
    """A rank that stops making progress: frozen where it is, holding its sockets."""
    import os

    os.kill(pid, signal.SIGSTOP)
