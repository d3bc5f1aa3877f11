"""Checks and rules are found by scanning the domain folders under node/checks, not by
hand-kept lists: every module there is loaded, and the registered names are the ones the
lists named when discovery replaced them (a module dropped or a check lost shows here)."""

from __future__ import annotations

import importlib
import sys

from gpuvigil.node import sweep
from gpuvigil.node.checks import REGISTRY
from gpuvigil.node.checks.domain import load_domains, modules_of
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
    return {
        name
        for domain in load_domains()
        for name in modules_of(importlib.import_module(f"gpuvigil.node.checks.{domain}"))
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
