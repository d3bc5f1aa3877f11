"""Every parser of captured output, fuzzed (hypothesis): nothing raises, garbage is never
judged healthy, a cut real output is never healthy against what the whole one showed, and
memory stays bounded. The readers are those `gpuvigil analyze` uses (`capture.judge.read`)
and the kernel-log capture reader; the verdicts come from the real rules."""

from __future__ import annotations

import dataclasses
import io
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuvigil.core.findings import NodeReport, Status
from gpuvigil.node.capture import judge as judging
from gpuvigil.node.capture.kinds import detect, kinds
from gpuvigil.node.checks.dcgm.readings import DcgmReport
from gpuvigil.node.checks.fabric.readings import FabricReading
from gpuvigil.node.checks.fabric.rules import FabricExpectation
from gpuvigil.node.checks.gpu.readings import GpuInventory
from gpuvigil.node.checks.kernel_log import kernel_log_capture
from gpuvigil.node.config import NodeConfig

DOCUMENT_KINDS = [k for k in kinds() if k not in ("kernel-log", "sysfs")]
NOW = datetime(2026, 11, 30, tzinfo=UTC)
UNIT = Path(__file__).resolve().parent
FUZZ = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

garbage = st.one_of(
    st.binary(max_size=4000),
    st.text(max_size=4000).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(
        st.sampled_from(
            [
                b"|",
                b" | ",
                b"+---+",
                b"GPU 0:",
                b"CA 'x'",
                b"port:",
                b"Link 1:",
                b"domain:",
                b"<nvidia_smi_log>",
                b"{",
                b"}",
                b"\n",
                b"\r",
                b"\x00",
                b"Xid (",
                b"Pass",
                b"Fail",
            ]
        ),
        max_size=200,
    ).map(b"".join),
)


def verdict(kind: str, data: bytes, expect: judging.Expect | None = None) -> list:
    found = []
    for reading in judging.read(kind, data):
        found += judging.judge(
            reading, node=NodeConfig(), expect=expect or judging.Expect(), now=NOW, check="x"
        )
    return found


def well_formed(kind: str, data: bytes) -> bool:
    """What a reader needs before it may call an output healthy."""
    for r in judging.read(kind, data):
        if isinstance(r, GpuInventory) and (r.errors or (not r.gpus and r.count != 0)):
            return False
        if isinstance(r, DcgmReport) and not r.complete:
            return False
        if isinstance(r, FabricReading) and (r.problems or any(a.problems for a in r.adapters)):
            return False
    return True


@pytest.mark.parametrize("kind", DOCUMENT_KINDS)
@FUZZ
@given(data=garbage)
def test_garbage_never_raises_and_is_never_healthy_unless_well_formed(
    kind: str, data: bytes
) -> None:
    found = verdict(kind, data)
    healthy = not any(f.status is Status.FAILED for f in found)
    if healthy:
        assert well_formed(kind, data), (kind, data[:200])


@FUZZ
@given(data=garbage)
def test_kernel_capture_garbage(data: bytes) -> None:
    cap = kernel_log_capture.read_capture(io.BytesIO(data), tz=UTC, now=NOW)
    found = kernel_log_capture.judge(cap, cfg=NodeConfig().kernel_log)
    if not any(f.status is Status.FAILED for f in found):
        assert cap.unreadable is None  # judged healthy only when it read as a kernel log
    detect(data[:65536])  # never raises


# A real output cut anywhere is never healthy when judged against what the whole one had.
CUTS = [
    ("nvidia-smi-csv", UNIT / "gpu/data/smi/query_gpu_8xh100.csv", judging.Expect(gpus=8)),
    (
        "nvidia-smi-nvlink",
        UNIT / "gpu/data/smi/nvlink_s_a100_gpu6_link4_inactive.txt",
        judging.Expect(gpus=8),
    ),
    (
        "dcgmi-discovery",
        UNIT / "gpu/data/smi/discovery_a100x8_nvswitch6.txt",
        judging.Expect(gpus=8),
    ),
    ("dcgmi-diag", UNIT / "gpu/data/dcgm/diag_v3_wrapped_cells.txt", None),
    ("dcgmi-diag", UNIT / "gpu/data/dcgm/diag_v4_warn_gpu2.txt", None),
    (
        "ibv_devinfo",
        UNIT / "fabric/data/ibv_devinfo_v_ib8_mlx5_3_polling.txt",
        judging.Expect(ib=FabricExpectation(kind="ib", count=8)),
    ),
    (
        "fi_info",
        UNIT / "fabric/data/fi_info_p4d_4dev.txt",
        judging.Expect(efa=FabricExpectation(kind="efa", count=4)),
    ),
]


@pytest.mark.parametrize(("kind", "path", "expect"), CUTS, ids=lambda x: getattr(x, "name", None))
@settings(max_examples=25, deadline=None)
@given(where=st.floats(min_value=0.0, max_value=0.97))
def test_a_cut_output_is_never_healthy(kind: str, path: Path, expect, where: float) -> None:
    full = path.read_bytes()
    cut = full[: int(len(full) * where)]
    # A cut that keeps every fact the rules read (fi_info's trailing "type:" lines after the
    # last device) loses nothing: nothing to assert there.
    assume(_facts(kind, cut) != _facts(kind, full))
    whole = verdict(kind, full, expect)
    part = verdict(kind, cut, expect)
    if any(f.status is Status.FAILED for f in whole):
        # The whole output had a failure: the cut one is not healthy either (it shows the
        # failure, or says it could not tell).
        assert NodeReport(node="n", findings=tuple(part)).exit_code() != 0, (kind, len(cut))
    else:
        assert any(f.status is Status.FAILED for f in part), (kind, len(cut))


def _facts(kind: str, data: bytes) -> object:
    """What the readers made of `data`, without the time it was read."""
    out = []
    for r in judging.read(kind, data):
        fields = dataclasses.asdict(r)
        out.append({k: v for k, v in fields.items() if k not in ("observed_at", "taken_at")})
    return out


def test_the_corpus_xml_cut_anywhere_is_never_healthy(corpus: Path) -> None:
    full = (corpus / "nvidia_smi" / "x_dual_a5000-v13_telegraf.xml").read_bytes()
    for i in range(1, 40):
        cut = full[: len(full) * i // 40]
        found = verdict("nvidia-smi-xml", cut, judging.Expect(gpus=2))
        assert any(f.status is Status.FAILED for f in found), i


@pytest.mark.parametrize("kind", DOCUMENT_KINDS)
def test_memory_stays_bounded(kind: str) -> None:
    data = (b"| x | y |\nCA 'a'\nGPU 0: z\n  Link 0: 1 GB/s\nhca_id: q\n" * 120000)[: 2 << 20]
    tracemalloc.start()
    try:
        verdict(kind, data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, (kind, peak)  # a bounded multiple of a 2 MB document
