"""The fake NVML module against nvidia-ml-py's own names and values, and the fault model."""

import json
import threading
import time
from pathlib import Path

import pynvml
import pytest

from gpuvigil.fakes import faults, gpu, nvml
from gpuvigil.fakes.faults import Fault


@pytest.fixture
def node():
    n = gpu.make_node(8)
    nvml.install(n)
    nvml.nvmlInit()
    yield n
    nvml.install(None)


def test_every_name_matches_nvidia_ml_py() -> None:
    for name in dir(nvml):
        if name.startswith(("NVML_", "nvml", "NVMLError")):
            assert hasattr(pynvml, name), name
            value = getattr(nvml, name)
            if isinstance(value, int):
                assert getattr(pynvml, name) == value, name


def test_error_subclasses_like_pynvml() -> None:
    e = nvml.NVMLError(15)
    assert type(e) is nvml.NVMLError_GpuIsLost and e.value == 15
    assert isinstance(nvml.NVMLError_LibraryNotFound(), nvml.NVMLError)
    assert nvml.NVMLError_LibraryNotFound().value == 12
    assert str(nvml.NVMLError(999)) == "Unknown Error"


def test_healthy_node_reads(node) -> None:
    assert nvml.nvmlDeviceGetCount() == 8
    h = nvml.nvmlDeviceGetHandleByIndex(3)
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert nvml.nvmlDeviceGetPciInfo(h).busId == "00000000:5D:00.0"
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetRetiredPages(h, 0)
    assert nvml.nvmlDeviceGetNvLinkState(h, 17) == 1
    with pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(h, 18)


def test_faults_show_up_in_nvml(node) -> None:
    faults.apply(node, Fault.ECC_UNCORRECTABLE, gpu=2)
    faults.apply(node, Fault.GPU_OFF_BUS, gpu=5)
    h2, h5 = nvml.nvmlDeviceGetHandleByIndex(2), None
    assert nvml.nvmlDeviceGetRemappedRows(h2) == (0, 1, 1, 0)
    assert nvml.nvmlDeviceGetTotalEccErrors(h2, 1, 0) == 1
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        h5 = nvml.nvmlDeviceGetHandleByIndex(5)
    assert h5 is None
    faults.reset_gpu(node, 2)
    assert nvml.nvmlDeviceGetRemappedRows(h2) == (0, 1, 0, 0)


def test_xid_events_are_delivered_once(node) -> None:
    es = nvml.nvmlEventSetCreate()
    for i in range(8):
        nvml.nvmlDeviceRegisterEvents(
            nvml.nvmlDeviceGetHandleByIndex(i), nvml.nvmlEventTypeXidCriticalError, es
        )
    faults.apply(node, Fault.APP_XID_43, gpu=1)
    ev = nvml.nvmlEventSetWait(es, 100)
    assert ev.eventData == 43 and ev.device == nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(es, 10)


def test_seeded_fault_picks_the_same_gpu() -> None:
    a, b = gpu.make_node(8), gpu.make_node(8)
    faults.apply(a, Fault.HW_SLOWDOWN, seed=7)
    faults.apply(b, Fault.HW_SLOWDOWN, seed=7)
    assert [g.clock_event_reasons for g in a.gpus] == [g.clock_event_reasons for g in b.gpus]


def test_hang_blocks_until_cleared(node) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    node.gpus[0].hang = True
    done = threading.Event()
    threading.Thread(target=lambda: (nvml.nvmlDeviceGetName(h), done.set()), daemon=True).start()
    assert not done.wait(0.2)
    node.gpus[0].hang = False
    assert done.wait(2)


def test_scenario_file_reloads_on_change(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "node.json"
    n = gpu.make_node(2)
    n.save(path)
    monkeypatch.setenv(gpu.SCENARIO_ENV, str(path))
    nvml.install(None)
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 2
    faults.apply(n, Fault.GPU_OFF_BUS, gpu=1)
    time.sleep(0.01)
    n.save(path)
    with pytest.raises(nvml.NVMLError_GpuIsLost):  # a GPU's reads start at its handle
        nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(1))
    assert gpu.FakeNode.load(path).to_dict() == n.to_dict()
    nvml.nvmlShutdown()


def test_no_scenario_is_library_not_found(monkeypatch) -> None:
    monkeypatch.delenv(gpu.SCENARIO_ENV, raising=False)
    nvml.install(None)
    with pytest.raises(nvml.NVMLError_LibraryNotFound):
        nvml.nvmlInit()


def test_driver_unavailable() -> None:
    n = faults.apply(gpu.make_node(1), Fault.DRIVER_UNAVAILABLE)
    nvml.install(n)
    try:
        with pytest.raises(nvml.NVMLError_DriverNotLoaded):
            nvml.nvmlInit()
    finally:
        nvml.install(None)


def test_unknown_scenario_key_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"gpus": [{"index": 0, "temprature": 3}]}))
    with pytest.raises(ValueError, match="temprature"):
        gpu.FakeNode.load(p)


@pytest.mark.parametrize("fault", list(Fault))
def test_every_fault_applies(fault: Fault) -> None:
    n = gpu.make_node(8)
    before = n.to_dict()
    faults.apply(n, fault, seed=3)
    assert n.to_dict() != before


def test_the_scenario_in_docs_fakes_md_loads(tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "fakes.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "s.yaml"
    path.write_text(block)
    node = gpu.FakeNode.load(path)
    assert [g.index for g in node.gpus] == [0, 1, 2, 3, 4]
    assert node.gpus[3].lost and node.gpus[3].xids[0].code == 79
    assert node.gpus[0].nvlinks[1].active is False
