"""NVML readings taken during the sustained load: decoding and every failure path."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from gpuvigil.node.active import telemetry


def test_decode_clock_event_reasons():
    assert telemetry.decode(0x1) == ["gpu_idle"]
    assert telemetry.decode(0x8 | 0x80) == ["hw_slowdown", "hw_power_brake_slowdown"]
    assert telemetry.decode(0) == []


def test_no_nvml_is_evidence_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert telemetry.sample(["0000:18:00.0"]) == {
        0: {"nvml": "unavailable: import of pynvml halted; None in sys.modules"}
    }


def _stub(fail_on: str | None = None) -> SimpleNamespace:
    """A stand-in for the NVML binding (no NVIDIA driver here)."""

    def maybe(name, value):
        def call(*args):
            if name == fail_on:
                raise RuntimeError(f"{name} failed")
            return value

        return call

    return SimpleNamespace(
        nvmlInit=maybe("init", None),
        nvmlShutdown=maybe("shutdown", None),
        nvmlDeviceGetHandleByPciBusId=maybe("handle", object()),
        nvmlDeviceGetCurrentClocksEventReasons=maybe("reasons", 0x80),
        nvmlDeviceGetClockInfo=maybe("clock", 1980),
        nvmlDeviceGetTemperature=maybe("temp", 71),
        nvmlDeviceGetPowerUsage=maybe("power", 699123),
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
    )


def test_sample_reads_each_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _stub())
    got = telemetry.sample(["0000:18:00.0", None])
    assert got == {
        0: {
            "clock_event_reasons": ["hw_power_brake_slowdown"],
            "sm_clock_mhz": 1980,
            "temperature_c": 71,
            "power_w": 699.1,
        }
    }


def test_nvml_failures_are_evidence(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _stub(fail_on="init"))
    assert telemetry.sample(["0000:18:00.0"])[0]["nvml"].startswith("unavailable")
    monkeypatch.setitem(sys.modules, "pynvml", _stub(fail_on="power"))
    assert telemetry.sample(["0000:18:00.0"])[0] == {"nvml": "error: power failed"}
