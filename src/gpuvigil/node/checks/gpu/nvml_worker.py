"""The NVML worker: a subprocess that makes the NVML calls, so a call that hangs inside the
driver can be abandoned and the process killed.

Run as `python -m gpuvigil.node.checks.gpu.nvml_worker MODULE` (MODULE: "pynvml" or
"gpuvigil.fakes.nvml"). Started and spoken to only by `gpuvigil.node.checks.gpu.nvml`. It
speaks JSON lines: on start it prints `{"ready": ...}` or `{"init_error": ...}`; then per
request line it answers with one line per GPU and a final `{"done": ...}` line, so the
parent keeps every GPU read before a hang and knows which GPU hung.

Requests: `{"op": "snapshot", "max_links": 36, "start": 0, "events": true}` (the events:
pending Xid events after the GPUs) and `{"op": "events",
"timeout_ms": 0, "max_events": 1000}`. A snapshot answers the device count first (a line
with `count` and no `gpu`), then one line per GPU from `start` on, so the parent can give
each GPU its own deadline and, when one hangs, start a new worker at the next GPU. Values
are raw NVML answers; an NVML error becomes `{"__err__": code, "name": "GpuIsLost"}`.
Converting raw values into readings is the parent's job (pure, tested without a
subprocess). Kept free of gpuvigil imports so it starts in tens of milliseconds.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# Calls that, when they fail with one of these codes, mean the GPU is gone: stop asking it.
_LOST_CODES = {15, 999}  # GpuIsLost, Unknown


class Worker:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.event_set: Any = None
        # Who each registered handle is, read while its GPU still answered: an Xid 79 GPU
        # (fallen off the bus) answers no call, and its event would name no GPU at all.
        self.registered: dict[Any, dict[str, Any]] = {}

    def err(self, e: Exception) -> dict[str, Any]:
        code = getattr(e, "value", None)
        name = type(e).__name__.removeprefix("NVMLError_")
        if not isinstance(code, int):
            return {"__err__": -1, "name": name, "message": str(e)[:200]}
        return {"__err__": code, "name": name, "message": str(e)[:200]}

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return _plain(fn(*args))
        except Exception as e:  # noqa: BLE001 - every NVML failure is data for the parent
            return self.err(e)

    def gpu(self, index: int, max_links: int) -> dict[str, Any]:
        n = self.nvml
        try:
            h = n.nvmlDeviceGetHandleByIndex(index)
        except Exception as e:  # noqa: BLE001
            return {"gpu": index, "handle_error": self.err(e)}
        raw: dict[str, Any] = {}
        lost = False

        def read(key: str, fn: Callable[..., Any], *args: Any) -> Any:
            nonlocal lost
            if lost:
                return None
            value = self.call(fn, h, *args)
            raw[key] = value
            if isinstance(value, dict) and value.get("__err__") in _LOST_CODES:
                lost = True
            return value

        read("name", n.nvmlDeviceGetName)
        read("uuid", n.nvmlDeviceGetUUID)
        read("serial", n.nvmlDeviceGetSerial)
        read("pci", lambda handle: n.nvmlDeviceGetPciInfo(handle).busId)
        read("architecture", n.nvmlDeviceGetArchitecture)
        read("memory_total", lambda handle: n.nvmlDeviceGetMemoryInfo(handle).total)
        read("ecc_mode", n.nvmlDeviceGetEccMode)
        for scope, scope_id in (("volatile", 0), ("aggregate", 1)):
            for kind, kind_id in (("corrected", 0), ("uncorrected", 1)):
                read(f"ecc_{scope}_{kind}", n.nvmlDeviceGetTotalEccErrors, kind_id, scope_id)
        read("retired_sbe", lambda handle: len(n.nvmlDeviceGetRetiredPages(handle, 0)))
        read("retired_dbe", lambda handle: len(n.nvmlDeviceGetRetiredPages(handle, 1)))
        read("retired_pending", n.nvmlDeviceGetRetiredPagesPendingStatus)
        read("remapped_rows", n.nvmlDeviceGetRemappedRows)
        read("temperature_gpu", n.nvmlDeviceGetTemperature, 0)
        read("temperature_memory", lambda handle: self._field(handle, 82))  # MEMORY_TEMP
        # The driver's recovery verdict: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (r550+), else
        # the older NVML_FI_DEV_RESET_STATUS / NVML_FI_DEV_DRAIN_AND_RESET_STATUS.
        action = read("recovery_action", lambda handle: self._field(handle, 230))
        if isinstance(action, dict):
            read("reset_status", lambda handle: self._field(handle, 226))
            read("drain_and_reset_status", lambda handle: self._field(handle, 227))
        read("threshold_shutdown", n.nvmlDeviceGetTemperatureThreshold, 0)
        read("threshold_slowdown", n.nvmlDeviceGetTemperatureThreshold, 1)
        read("threshold_mem_max", n.nvmlDeviceGetTemperatureThreshold, 2)
        reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
        read("clock_event_reasons", reasons or n.nvmlDeviceGetCurrentClocksThrottleReasons)
        read("pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration)
        read("pcie_gen_max", n.nvmlDeviceGetMaxPcieLinkGeneration)
        read("pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth)
        read("pcie_width_max", n.nvmlDeviceGetMaxPcieLinkWidth)
        if not lost:
            raw["nvlinks"] = self._links(h, max_links)
        return {"gpu": index, "raw": raw}

    def _field(self, h: Any, field_id: int) -> Any:
        """One NVML field value (ids are stable numbers, so older bindings work too)."""
        n = self.nvml
        value = n.nvmlDeviceGetFieldValues(h, [field_id])[0]
        if value.nvmlReturn != 0:
            raise n.NVMLError(value.nvmlReturn)
        return value.value.uiVal

    def _links(self, h: Any, max_links: int) -> list[dict[str, Any]]:
        n, links = self.nvml, []
        for link in range(max_links):
            state = self.call(n.nvmlDeviceGetNvLinkState, h, link)
            if isinstance(state, dict) and state.get("name") in {"NotSupported", "InvalidArgument"}:
                break  # past the last link this GPU has
            entry: dict[str, Any] = {"link": link, "state": state}
            for key, counter in (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3)):
                entry[key] = self.call(n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            links.append(entry)
        return links

    def snapshot(self, req: dict[str, Any]) -> None:
        n = self.nvml
        count = self.call(n.nvmlDeviceGetCount)
        driver = self.call(n.nvmlSystemGetDriverVersion)
        emit({"count": count, "driver_version": driver})
        if isinstance(count, int):
            for i in range(max(0, int(req.get("start", 0))), count):
                emit(self.gpu(i, int(req.get("max_links", 36))))
        if req.get("events"):  # NVML's Xid events in the same round trip
            emit({"events": self.drain(req)})
        emit({"done": True, "count": count, "driver_version": driver})

    def events(self, req: dict[str, Any]) -> None:
        emit({"done": True, "events": self.drain(req)})

    def drain(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        """Pending Xid events (registering for them on the first call)."""
        n, out = self.nvml, []
        if self.event_set is None:
            self.event_set = n.nvmlEventSetCreate()
            for i in range(n.nvmlDeviceGetCount()):
                try:
                    h = n.nvmlDeviceGetHandleByIndex(i)
                    n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self.event_set)
                    self.registered[handle_key(h)] = {
                        "gpu": i,
                        "uuid": self.call(n.nvmlDeviceGetUUID, h),
                        "pci": self.call(lambda h: n.nvmlDeviceGetPciInfo(h).busId, h),
                    }
                except Exception as e:  # noqa: BLE001 - a GPU that cannot register is reported
                    out.append({"gpu": i, "register_error": self.err(e)})
        timeout_ms = int(req.get("timeout_ms", 0))
        for _ in range(int(req.get("max_events", 1000))):
            try:
                ev = n.nvmlEventSetWait(self.event_set, timeout_ms)
            except Exception as e:  # noqa: BLE001 - Timeout: nothing (more) pending
                if getattr(e, "value", None) != 10:
                    out.append({"wait_error": self.err(e)})
                break
            timeout_ms = 0
            known = self.registered.get(handle_key(ev.device), {})
            said = {
                "gpu": self.call(n.nvmlDeviceGetIndex, ev.device),
                "uuid": self.call(n.nvmlDeviceGetUUID, ev.device),
                "pci": self.call(lambda h: n.nvmlDeviceGetPciInfo(h).busId, ev.device),
            }
            for key, value in said.items():  # a lost GPU answers errors: who it was
                if isinstance(value, dict) and isinstance(known.get(key), int | str):
                    said[key] = known[key]
            out.append({**said, "event_type": int(ev.eventType), "xid": int(ev.eventData)})
        return out


def handle_key(handle: Any) -> Any:
    """The same device's handles compare equal by this key: pynvml's are ctypes pointers
    (a new object per call, the same address), the fake's are frozen values."""
    try:
        return ("address", ctypes.cast(handle, ctypes.c_void_p).value)
    except (TypeError, ctypes.ArgumentError):
        try:
            hash(handle)
        except TypeError:
            return ("id", id(handle))
        return ("value", handle)


def _plain(value: Any) -> Any:
    """NVML answers as JSON values (bytes from old bindings become text)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def die_with_parent(interval_s: float = 1.0) -> None:
    """Exit when the process that started this worker is gone, even killed by SIGKILL.

    A worker stuck in a driver call would otherwise outlive its agent. ctypes releases the
    GIL around NVML calls, so this thread runs while the main thread is stuck in one.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    die_with_parent()
    module = argv[1] if len(argv) > 1 else "pynvml"
    try:
        nvml = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - no binding is a finding, not a traceback
        emit({"init_error": {"__err__": -1, "name": "ImportError", "message": str(e)[:300]}})
        return 1
    worker = Worker(nvml)
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001
        emit({"init_error": worker.err(e)})
        return 1
    emit({"ready": True, "module": module})
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            emit({"done": True, "error": "bad request"})
            continue
        op = req.get("op")
        if op == "snapshot":
            worker.snapshot(req)
        elif op == "events":
            worker.events(req)
        else:
            emit({"done": True, "error": f"unknown op {op!r}"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
