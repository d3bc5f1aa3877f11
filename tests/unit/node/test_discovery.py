"""Checks and rules are found by scanning the domain folders under node/checks, not by
hand-kept lists: every module there is loaded, and the registered names are the ones the
lists named when discovery replaced them (a module dropped or a check lost shows here)."""

from __future__ import annotations

import importlib
import sys

from gpuvigil.node import sweep
from gpuvigil.node.checks import REGISTRY
from gpuvigil.node.checks.domain import FAKE_MODULE, load_domains, modules_of
from gpuvigil.node.pipeline import judge

# What CHECK_MODULES / RULE_MODULES registered, measured on the code before discovery.
CHECKS_BEFORE = {"dcgm_diag", "dcgm_health", "fabric", "gpu", "kernel_log", "pcie"}
RULES_BEFORE = {
    "dcgm",
    "driver_faults",
    "fabric",
    "fabric_manager",
    "gpu",
    "gpu_fabric_registration",
    "gpu_links",
    "gpu_memory",
    "gpu_thermal",
    "nic_counts",
    "nvlink_counts",
    "pcie",
    "topology",
    "xid",
}


def _domain_modules() -> set[str]:
    """Every module of every domain but its `fake.py`, which only the simulator imports."""
    return {
        name
        for domain in load_domains()
        for name in modules_of(importlib.import_module(f"gpuvigil.node.checks.{domain}"))
        if name.rpartition(".")[2] != FAKE_MODULE
    }


def test_every_domain_module_is_loaded_and_checks_are_unchanged() -> None:
    sweep.load_checks()
    modules = _domain_modules()
    assert "gpuvigil.node.checks.gpu.nvml" in modules
    assert "gpuvigil.node.checks.kernel_log.rules.xid" in modules
    assert modules - set(sys.modules) == set()
    assert set(REGISTRY) == CHECKS_BEFORE


def test_every_rule_module_is_loaded_and_rules_are_unchanged() -> None:
    judge.load_rules()
    assert _domain_modules() - set(sys.modules) == set()
    assert set(judge.load_rules()) == RULES_BEFORE


def test_the_agents_scan_imports_no_fake() -> None:
    """`load_checks`/`load_rules` leave every domain's `fake.py` out: production code
    imports no fake (a fresh interpreter, since tests import the fakes themselves)."""
    import subprocess

    code = (
        "import sys\n"
        "from gpuvigil.node import sweep\n"
        "from gpuvigil.node.pipeline import judge\n"
        "sweep.load_checks(); judge.load_rules()\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpuvigil.fakes') "
        "or m.endswith('.fake')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "[]", out.stdout
