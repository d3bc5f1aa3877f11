"""DCGM: parsers over our fixtures in the real layouts (3.x and 4.x, JSON and tables) and over
verbatim public outputs (data/dcgm/*_real_*, cited on their tests), the rules, garbage, and
the fail-closed paths of the dcgmi binary (absent optional/required, hang, crash, garbage,
non-zero exit)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvigil.core.findings import Action, NodeReport
from gpuvigil.node.capture.bundle import Limits
from gpuvigil.node.capture.judge import Expect
from gpuvigil.node.capture.kinds import detect
from gpuvigil.node.capture.session import Options, analyze
from gpuvigil.node.checks import REGISTRY, CheckContext, run_check
from gpuvigil.node.checks.dcgm import rules
from gpuvigil.node.checks.dcgm.dcgm_health_parse import parse_health
from gpuvigil.node.checks.dcgm.dcgm_parse import parse_diag
from gpuvigil.node.config import NodeConfig

DATA = Path(__file__).parent / "data" / "dcgm"
NOW = datetime(2026, 11, 30, tzinfo=UTC)
OPTS = Options(node=NodeConfig(), expect=Expect(), limits=Limits())


def summary(findings):
    return sorted((f.code, f.status.value, f.component) for f in findings)


def test_diag_v3_json() -> None:
    report = parse_diag((DATA / "diag_v3_fail.json").read_text(), level=2)
    assert report.complete and report.overall == "Fail"
    assert summary(rules.diag(report, now=NOW)) == [
        ("DCGM_DIAG_FAIL", "FAILED", "gpu:2"),
        ("DCGM_DIAG_FAIL", "WARNING", "gpu:1"),
    ]
    f = next(x for x in rules.diag(report, now=NOW) if x.component == "gpu:2")
    assert "PCIe fail" in f.message and "7.9 GB/s" in f.evidence["tests"][0]["info"]


def test_diag_v4_json() -> None:
    report = parse_diag((DATA / "diag_v4_fail.json").read_text())
    assert summary(rules.diag(report, now=NOW)) == [("DCGM_DIAG_FAIL", "FAILED", "gpu:1")]
    assert "uncorrectable" in rules.diag(report, now=NOW)[0].evidence["tests"][0]["info"]


def test_diag_runtime_error_is_could_not_tell_not_a_pass() -> None:
    # The same answer as the health parser gives an unreadable report: exit 2, not 1.
    report = parse_diag((DATA / "diag_v4_runtime_error.json").read_text())
    assert not report.complete
    found = rules.diag(report, now=NOW)
    assert summary(found) == [("CHECK_ERROR", "FAILED", "node")]
    assert "host engine" in found[0].message


def test_diag_v3_table() -> None:
    report = parse_diag((DATA / "diag_v3_table_fail.txt").read_text())
    assert report.complete, report.errors
    assert summary(rules.diag(report, now=NOW)) == [("DCGM_DIAG_FAIL", "FAILED", "gpu:2")]
    assert "cudaMemcpy" in rules.diag(report, now=NOW)[0].evidence["tests"][0]["info"]


def test_diag_v4_table() -> None:
    report = parse_diag((DATA / "diag_v4_table_fail.txt").read_text())
    assert report.complete, report.errors
    assert summary(rules.diag(report, now=NOW)) == [("DCGM_DIAG_FAIL", "FAILED", "gpu:3")]


def test_diag_table_cut_short_is_incomplete() -> None:
    lines = (DATA / "diag_v3_table_fail.txt").read_text().splitlines()
    report = parse_diag("\n".join(lines[:12]))
    assert not report.complete
    assert summary(rules.diag(report, now=NOW)) == [("CHECK_ERROR", "FAILED", "node")]
    # Cut after the failing row: the failure read so far is kept beside "could not tell".
    report = parse_diag("\n".join(lines[:19]))
    assert summary(rules.diag(report, now=NOW)) == [
        ("CHECK_ERROR", "FAILED", "node"),
        ("DCGM_DIAG_FAIL", "FAILED", "gpu:2"),
    ]


def test_diag_all_skipped_is_not_a_pass() -> None:
    doc = '{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": '
    doc += '[{"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Skip"}]}]}]}}'
    assert summary(rules.diag(parse_diag(doc), now=NOW)) == [("CHECK_ERROR", "FAILED", "node")]


@pytest.mark.parametrize("name", ["health_fail.json", "health_fail.txt"])
def test_health_failures(name: str) -> None:
    # Invented, in the flat "GPU ID: n" layout of older dcgmi tables. No DCGM source read
    # writes that JSON (dcgmi/DcgmiOutput nests group -> entity id: HEALTH_V4_JSON below); kept
    # so a flat document is still pinned per GPU rather than passed.
    report = parse_health((DATA / name).read_text())
    assert report.complete and report.overall == "Fail"
    found = rules.health(report, now=NOW)
    assert summary(found) == [
        ("DCGM_HEALTH_FAIL", "FAILED", "gpu:0"),
        ("DCGM_HEALTH_FAIL", "WARNING", "gpu:3"),
    ]
    assert found[0].action == "RESET_GPU"
    assert "row remap" in str(found[0].evidence)


@pytest.mark.parametrize("name", ["health_ok.json", "health_ok.txt"])
def test_health_ok(name: str) -> None:
    report = parse_health((DATA / name).read_text())
    assert report.complete and rules.health(report, now=NOW) == []


# Real `dcgmi health -c` answers posted publicly, verbatim (data/dcgm/health_real_*):
REAL_HEALTH = {
    # `dcgmi health -s a` then `dcgmi health -c -j` (preamble line and all), from
    # https://github.com/NVIDIA/DCGM/issues/263 (GPU 1 needed a reset; DCGM said Healthy).
    "health_real_dcgm263_healthy_preamble.json": ("Pass", []),
    # Tab-indented `-j` from microsoft/VirtualClient src/VirtualClient/
    # VirtualClient.Actions.UnitTests/Examples/DCGMI/DCGMIHealthCheckResults.json.
    "health_real_virtualclient_healthy.json": ("Pass", []),
    # Text table of `dcgmi health -g 0 -c`, DCGM 4.5.2, 4x GB200, driver 580.126.20, from
    # https://github.com/NVIDIA/DCGM/issues/313 (a GPU with 54.7e9 corrected ECC errors).
    "health_real_dcgm313_v452_gb200_healthy.txt": ("Pass", []),
    # Text tree of `dcgmi health -c`, DCGM 4.6.1, one L4 under a training load, from
    # github.com/shukla-surendra/mini-llms-playground
    # infra/gcp-gpu-node/docs/dcgm_gpu_command_reference.md ("Check GPU Health").
    "health_real_minillms_v461_l4_power_warning.txt": (
        "Warn",
        [("DCGM_HEALTH_FAIL", "WARNING", "gpu:0")],
    ),
}


@pytest.mark.parametrize("name", sorted(REAL_HEALTH))
def test_health_real_outputs(name: str) -> None:
    overall, want = REAL_HEALTH[name]
    report = parse_health((DATA / name).read_text())
    assert report.complete and report.overall == overall
    assert summary(rules.health(report, now=NOW)) == want


def test_health_real_power_warning_is_gpu_0s_power_system() -> None:
    report = parse_health((DATA / "health_real_minillms_v461_l4_power_warning.txt").read_text())
    [r] = report.results
    assert (r.test, r.result, r.gpu) == ("power", "Warn", 0)
    # The message dcgmi cut into rows is read back whole.
    assert (
        "power violation in GPU 0. Monitor the power conditions. This GPU can still "
        "perform workload." in r.info
    )
    [f] = rules.health(report, now=NOW)
    assert f.action is Action.NONE and f.evidence["systems"][0]["test"] == "power"


def test_analyze_takes_every_real_health_output_for_what_it_is() -> None:
    # Through `gpuvigil analyze`'s own path: told from content, judged, one exit code each.
    for name, (_, want) in REAL_HEALTH.items():
        report, [inp] = analyze([(str(DATA / name), None)], opts=OPTS)
        assert inp.kind == "dcgmi-health", name
        assert summary(report.findings) == want, name
        assert report.exit_code() == 0, name  # a Warning is reported, never a failure
    report, _ = analyze([(str(DATA / n), None) for n in sorted(REAL_HEALTH)], opts=OPTS)
    assert summary(report.findings) == [("DCGM_HEALTH_FAIL", "WARNING", "gpu:0")]


# Other dcgmi answers in the same {"body", "header"} JSON framing, verbatim (DCGM 3.1.8, 8x
# H800) from liguodongiot/llm-action docs/llm-base/dcgmi.md: `dcgmi topo -g 0 -j` and the
# head of `dcgmi nvlink -g 0 -e -j`. They were taken for a health report missing its verdict.
DCGMI_TOPO_JSON = """{
        "body" :
        {
                "CPU Core Affinity" :
                {
                        "value" : "0 - 127"
                },
                "NUMA Optimal" :
                {
                        "value" : "False"
                },
                "Worst Path" :
                {
                        "value" : "Connected via a CPU-level link"
                }
        },
        "header" :
        [
                "Topology Information",
                "DCGM_ALL_SUPPORTED_GPUS"
        ]
}
"""
DCGMI_NVLINK_JSON = """{
        "body" :
        {
                "Link 0" :
                {
                        "children" :
                        {
                                "CRC Data Error" :
                                {
                                        "value" : "0"
                                }
                        }
                }
        },
        "header" :
        [
                "NVLINK Error Counts",
                "GPU 0"
        ]
}
"""


def test_other_dcgmi_json_is_not_a_health_report(tmp_path: Path) -> None:
    assert detect(DCGMI_TOPO_JSON.encode()) is None
    path = tmp_path / "dcgmi.json"
    path.write_text(DCGMI_TOPO_JSON)
    report, [inp] = analyze([(str(path), None)], opts=OPTS)
    assert inp.kind is None and report.exit_code() == 2  # named as not recognised, not judged


def test_dcgmi_nvlink_json_is_read_as_nvlink_counters(tmp_path: Path) -> None:
    # `dcgmi nvlink -e -j` shares the JSON framing but is its own kind (counters/formats.py).
    assert detect(DCGMI_NVLINK_JSON.encode()) == "nvlink-counters"
    path = tmp_path / "dcgmi.json"
    path.write_text(DCGMI_NVLINK_JSON)
    report, [inp] = analyze([(str(path), None)], opts=OPTS)
    assert inp.kind == "nvlink-counters" and report.exit_code() == 0  # CRC Data Error 0
    path.write_text(DCGMI_NVLINK_JSON.replace('"value" : "0"', '"value" : "12"'))
    report, _ = analyze([(str(path), None)], opts=OPTS)
    assert {(f.code, f.component) for f in report.problems} == {("NVLINK_ERROR_COUNTS", "gpu:0")}


# The JSON dcgmi 4.x writes for `health -c -j` when there are incidents. Invented (edge case):
# no such output has been posted publicly; the layout is the one NVIDIA/DCGM dcgmi/Health.cpp
# (HandleOneEntity: group, entity id, "Errors", "<name> system") builds through
# dcgmi/DcgmiOutput.h (every node {"value", "children", "overflow"}), filled with the real
# L4 incident above plus a memory failure on GPU 1 and a switch warning.
HEALTH_V4_JSON = {
    "body": {
        "GPU": {
            "children": {
                "0": {
                    "children": {
                        "Errors": {
                            "children": {
                                "Power system": {
                                    "overflow": [
                                        "Detected clocks event due to power violation in GPU 0.",
                                        "Monitor the power conditions. This GPU can still",
                                        "perform workload.",
                                    ],
                                    "value": "Warning",
                                }
                            }
                        }
                    },
                    "value": "Warning",
                },
                "1": {
                    "children": {
                        "Errors": {
                            "children": {
                                "Memory system": {
                                    "overflow": ["A row remap is pending on GPU 1"],
                                    "value": "Failure",
                                }
                            }
                        }
                    },
                    "value": "Failure",
                },
            }
        },
        "Overall Health": {"value": "Failure"},
        "Switch": {"children": {"0": {"children": {"Errors": {}}, "value": "Warning"}}},
    },
    "header": ["Health Monitor Report"],
}


def test_health_v4_json_pins_each_system_to_its_gpu() -> None:
    import json

    report = parse_health(json.dumps(HEALTH_V4_JSON, indent=8))
    assert report.complete and report.overall == "Fail"
    assert [(r.test, r.result, r.gpu) for r in report.results] == [
        ("power", "Warn", 0),
        ("memory", "Fail", 1),
        ("switch 0", "Warn", None),  # switch 0 is the node's, not GPU 0's
    ]
    assert report.results[0].info.endswith("This GPU can still perform workload.")
    found = rules.health(report, now=NOW)
    assert summary(found) == [
        ("DCGM_HEALTH_FAIL", "FAILED", "gpu:1"),
        ("DCGM_HEALTH_FAIL", "WARNING", "gpu:0"),
        ("DCGM_HEALTH_FAIL", "WARNING", "node"),
    ]
    assert next(f for f in found if f.component == "gpu:1").action is Action.RESET_GPU


@pytest.mark.parametrize(
    "text",
    [
        # HelperHealthToString's answer for a result it does not know (dcgmi/Health.cpp).
        '{"body": {"Overall Health": {"value": "Internal error"}}}',
        "| Overall Health            | Internal error        |\n",
        '{"body": {"GPU": {"children": {"0": {"value": "Failure"}}}}}',  # no Overall Health
        '{"body": ["Overall Health", "Healthy"]}',
    ],
)
def test_health_without_a_readable_overall_is_could_not_tell(text: str) -> None:
    report = parse_health(text)
    found = rules.health(report, now=NOW)
    assert not report.complete and ("CHECK_ERROR", "FAILED", "node") in summary(found)
    exit_code = NodeReport(node="n", findings=tuple(found)).exit_code()
    if "Failure" in text:  # what was read is kept beside the could-not-tell
        assert ("DCGM_HEALTH_FAIL", "FAILED", "gpu:0") in summary(found) and exit_code == 1
    else:
        assert exit_code == 2


HEALTH_TREE = """\
+---------------------------+----------------------------------------------------------+
| Health Monitor Report                                                                |
+===========================+==========================================================+
| Overall Health            | Failure                                                  |
| GPU                       |                                                          |
| -> 1                      | Failure                                                  |
|    -> Errors              |                                                          |
|       -> Memory system    | Failure                                                  |
|                           | A row remap is pending on GPU 1; reset the GPU.          |
| -> 3                      | Warning                                                  |
|    -> Errors              |                                                          |
|       -> PCIe system      | Warning                                                  |
|                           | Replays on GPU 3 above the threshold.                    |
| NvSwitch                  |                                                          |
| -> 0                      | Warning                                                  |
+---------------------------+----------------------------------------------------------+
"""


def test_health_tree_layout_pins_each_system_to_its_gpu() -> None:
    # Invented edge case in the tree dcgmi 4.x prints (group, "-> <entity id>", "-> Errors",
    # "-> <name> system", message rows; NVIDIA/DCGM dcgmi/Health.cpp). It was read as one
    # node-level "overall" verdict naming no GPU and no system. An NvSwitch entity 0 is not
    # GPU 0: its warning is the node's.
    report = parse_health(HEALTH_TREE)
    assert report.complete and report.overall == "Fail"
    assert [(r.test, r.result, r.gpu) for r in report.results] == [
        ("memory", "Fail", 1),
        ("pcie", "Warn", 3),
        ("nvswitch 0", "Warn", None),
    ]
    assert "row remap is pending" in report.results[0].info
    assert summary(rules.health(report, now=NOW)) == [
        ("DCGM_HEALTH_FAIL", "FAILED", "gpu:1"),
        ("DCGM_HEALTH_FAIL", "WARNING", "gpu:3"),
        ("DCGM_HEALTH_FAIL", "WARNING", "node"),
    ]


def test_health_unreadable_is_check_error() -> None:
    found = rules.health(parse_health("Error: unable to connect to host engine"), now=NOW)
    assert summary(found) == [("CHECK_ERROR", "FAILED", "node")]


# Real: dcgmi 4.7.0's health commands on a host where the health module's API version
# mismatched (https://github.com/NVIDIA/DCGM/issues/314, `dcgmi health --set a` and
# `dcgmi health -f`). Whatever health command hit it, the answer is "could not tell".
REAL_314 = (
    "Error: Unable to set health watches. Return: API version mismatch\n",
    "Error: Unable to get health watches. Return: API version mismatch\n",
)


@pytest.mark.parametrize("text", REAL_314)
def test_health_real_api_version_mismatch_is_could_not_tell(text: str, tmp_path: Path) -> None:
    found = rules.health(parse_health(text), now=NOW)
    assert summary(found) == [("CHECK_ERROR", "FAILED", "node")]
    assert NodeReport(node="n", findings=tuple(found)).exit_code() == 2
    f = tmp_path / "health.txt"
    f.write_text(text)
    assert detect(f.read_bytes()) is None  # an error line, not a report: named, not judged
    report, _ = analyze([(str(f), None)], opts=OPTS)
    assert report.exit_code() == 2


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=3000), st.binary(max_size=1000)))
def test_garbage_never_raises_and_never_passes(data) -> None:
    for report, judge in ((parse_diag(data), rules.diag), (parse_health(data), rules.health)):
        found = judge(report, now=NOW)
        if report.kind == "diag":
            assert found, "garbage must not read as a passing diagnostic"


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=3000), st.text(max_size=30))
def test_mangled_real_output_never_raises(cut, junk) -> None:
    for name in ("diag_v3_fail.json", "diag_v4_table_fail.txt"):
        text = (DATA / name).read_text()
        rules.diag(parse_diag(text[:cut] + junk + text[cut:]), now=NOW)


# --- The binary, fail closed -----------------------------------------------------------------
def ctx(path: str, **dcgm) -> CheckContext:
    cfg = NodeConfig.model_validate({"dcgm": {"diag_timeout_s": 2, "health_timeout_s": 2, **dcgm}})
    return CheckContext(config=cfg, env={**os.environ, "PATH": path})


@pytest.fixture(autouse=True)
def _checks() -> None:
    from gpuvigil.node import sweep

    sweep.load_checks()


def test_absent_optional_is_reported_disabled(fake_bin) -> None:
    findings, run = run_check(REGISTRY["dcgm_health"], ctx(str(fake_bin.dir)))
    assert [(f.code, f.status.value) for f in findings] == [("CHECK_DISABLED", "OK")]
    assert run.disabled


def test_absent_required_is_dependency_missing(fake_bin) -> None:
    findings, run = run_check(REGISTRY["dcgm_diag"], ctx(str(fake_bin.dir), required=True))
    assert [f.code for f in findings] == ["DEPENDENCY_MISSING"] and not run.disabled


def test_diag_failure_exit_code_still_parsed(fake_bin) -> None:
    fake_bin("dcgmi", f"#!/bin/sh\ncat {DATA / 'diag_v4_fail.json'}\nexit 226\n")
    findings, _ = run_check(REGISTRY["dcgm_diag"], ctx(f"{fake_bin.dir}:/usr/bin:/bin"))
    assert summary(findings) == [("DCGM_DIAG_FAIL", "FAILED", "gpu:1")]


def test_health_passes_through_the_binary(fake_bin) -> None:
    fake_bin("dcgmi", f"#!/bin/sh\ncat {DATA / 'health_ok.json'}\n")
    findings, run = run_check(REGISTRY["dcgm_health"], ctx(f"{fake_bin.dir}:/usr/bin:/bin"))
    assert findings == [] and run.status == "OK"


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ("#!/bin/sh\nsleep 60\n", "CHECK_TIMEOUT"),
        ("#!/bin/sh\nsleep 60 &\nwait\n", "CHECK_TIMEOUT"),
        ("#!/bin/sh\nkill -SEGV $$\n", "CHECK_ERROR"),
        (
            "#!/bin/sh\necho 'Error: unable to establish a connection' >&2\nexit 255\n",
            "CHECK_ERROR",
        ),
        ('#!/bin/sh\necho \'{"not": "dcgm"}\'\n', "CHECK_ERROR"),
        ("#!/bin/sh\necho '{\"body\": {}}'\nexit 3\n", "CHECK_ERROR"),
        ("#!/bin/sh\nhead -c 100000000 /dev/zero\n", "CHECK_ERROR"),  # cut: could not tell
    ],
    ids=["hang", "hanging-child", "crash", "no-hostengine", "garbage", "exit-no-verdict", "100MB"],
)
def test_diag_binary_fail_closed(fake_bin, script, code) -> None:
    fake_bin("dcgmi", script)
    findings, run = run_check(REGISTRY["dcgm_diag"], ctx(f"{fake_bin.dir}:/usr/bin:/bin"))
    assert [f.code for f in findings] == [code] and run.status == "FAILED"
