"""`dcgmi diag` text tables in the layouts people posted publicly.

Each fixture is ours, written to reproduce the structure of a real posted output (cited on
its test): 45-character Warning/Info/Error pieces, empty-name status rows, DCGM 4.x
per-GPU rows, the r3 `Diagnostic` test and the `Inforom` deployment test. The layout
itself is `dcgmi/Diag.cpp` of NVIDIA/DCGM @ 28bfbd4c97413d4aec249cdd9543a67d24f95b78
(DATA_INFO_TAG_LEN 45; an `Error` cell after a failed deployment test).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuvigil.core.findings import NodeReport
from gpuvigil.node.checks.dcgm import rules
from gpuvigil.node.checks.dcgm.dcgm_health_parse import parse_health
from gpuvigil.node.checks.dcgm.dcgm_parse import parse_diag

DATA = Path(__file__).parent / "data" / "dcgm"
NOW = datetime(2026, 11, 30, tzinfo=UTC)


def judged(name: str):
    report = parse_diag((DATA / name).read_text())
    return report, rules.diag(report, now=NOW)


def codes(findings) -> list[tuple[str, str, str]]:
    return sorted((f.code, f.status.value, f.component) for f in findings)


def test_wrapped_cells_keep_the_failed_gpu() -> None:
    # Structure of https://github.com/NVIDIA/go-dcgm/issues/52 (DCGM 3.3.1, -r 2): pieces
    # such as "-capable device(s)..." and "t GPU. Restart DCGM" are text, not results.
    report, found = judged("diag_v3_wrapped_cells.txt")
    assert report.complete, report.errors
    assert codes(found) == [("DCGM_DIAG_FAIL", "FAILED", "gpu:0")]
    tests = found[0].evidence["tests"]
    assert {t["test"] for t in tests} == {"PCIe", "GPU Memory"}
    memory = next(t for t in tests if t["test"] == "GPU Memory")
    assert "Unable to create CUDA context" in memory["info"]  # the pieces joined again


def test_inforom_and_the_r3_diagnostic_test_are_results() -> None:
    # Layout of https://github.com/NVIDIA/DCGM/issues/55 (DCGM 3.0.4, -r 3): "Inforom" is a
    # deployment test (not an "Info" cell) and "Diagnostic" a hardware test (not the header).
    report, found = judged("diag_v3_r3_inforom_diagnostic.txt")
    assert report.complete, report.errors
    assert {(r.test, r.result, r.gpu) for r in report.results if r.result == "Fail"} == {
        ("Inforom", "Fail", 3),  # pinned: its Error cell names GPU 3
        ("Diagnostic", "Fail", 3),
    }
    assert codes(found) == [("DCGM_DIAG_FAIL", "FAILED", "gpu:3")]
    assert NodeReport(node="n", findings=tuple(found)).exit_code() == 1


def test_r3_pcie_failure_on_one_of_four() -> None:
    # Layout of https://github.com/IBM/autopilot/issues/68 (DCGM 3.3.5, -r 3, PCIe failed).
    report, found = judged("diag_v335_r3_pcie_fail.txt")
    assert report.complete and report.overall == "Fail"
    assert codes(found) == [("DCGM_DIAG_FAIL", "FAILED", "gpu:3")]
    assert "cudaMemcpy" in found[0].evidence["tests"][0]["info"]


def test_dcgm4_per_gpu_rows_and_a_named_warning() -> None:
    # Layout of https://github.com/NVIDIA/DCGM/issues/253 (DCGM 4.2.3): "software | Pass"
    # then "GPU0: Pass" rows; a warned GPU is a WARNING on that GPU, not the node.
    report, found = judged("diag_v4_warn_gpu2.txt")
    assert report.complete, report.errors
    assert codes(found) == [("DCGM_DIAG_FAIL", "WARNING", "gpu:2")]
    assert "row remappings" in found[0].evidence["tests"][0]["info"]


def test_deployment_error_is_pinned_to_the_gpu_it_names() -> None:
    # The detail text of https://github.com/NVIDIA/NVSentinel/pull/772 ("Persistence mode
    # for GPU 0 is disabled..."), in the table's Error cell.
    _, found = judged("diag_v3_deployment_error_gpu1.txt")
    assert codes(found) == [("DCGM_DIAG_FAIL", "FAILED", "gpu:1")]
    json_doc = (
        '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": '
        '[{"name": "Persistence Mode", "results": [{"gpu_ids": "0,1,2,3", "status": "Fail", '
        '"warnings": "Persistence mode for GPU 2 is disabled."}]}]}]}}'
    )
    assert codes(rules.diag(parse_diag(json_doc), now=NOW)) == [
        ("DCGM_DIAG_FAIL", "FAILED", "gpu:2")
    ]


@pytest.mark.parametrize(
    "text",
    [
        # dcgmi's own failure messages (dcgmi/Diag.cpp HelperDisplayFailureMessage)
        "Error: Unable to complete diagnostic for group 2147483647. Return: (-37) "
        "The GPU is not supported.\n",
        "Error: Diagnostic could not be run because the Tesla recommended driver is not "
        "being used.\n",
        "Error: unable to establish a connection to the specified host: localhost\n"
        "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n",
        '{"DCGM GPU Diagnostic": {"runtime_error": "Error: Unable to complete diagnostic"}}',
    ],
)
def test_runtime_errors_are_could_not_tell_for_diag_and_health_alike(text: str) -> None:
    diag = rules.diag(parse_diag(text), now=NOW)
    health = rules.health(parse_health(text), now=NOW)
    assert codes(diag) == [("CHECK_ERROR", "FAILED", "node")]
    assert codes(health) == [("CHECK_ERROR", "FAILED", "node")]
    for found in (diag, health):
        assert NodeReport(node="n", findings=tuple(found)).exit_code() == 2


def test_cut_after_a_failure_keeps_the_failure() -> None:
    lines = (DATA / "diag_v3_wrapped_cells.txt").read_text().splitlines()
    cut = "\n".join(lines[: lines.index(next(ln for ln in lines if "cuCtxCreate" in ln)) + 2])
    found = rules.diag(parse_diag(cut), now=NOW)
    assert ("DCGM_DIAG_FAIL", "FAILED", "gpu:0") in codes(found)
    assert ("CHECK_ERROR", "FAILED", "node") in codes(found)
    assert NodeReport(node="n", findings=tuple(found)).exit_code() == 1
