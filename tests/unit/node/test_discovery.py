"""Checks and rules are found by scanning node/probes and node/rules, not by hand-kept
lists: every module there is loaded, and the registered names are the ones the lists
named when discovery replaced them (a module dropped or a check lost shows here)."""

from __future__ import annotations

import pkgutil
import sys

from gpuvigil.node import probes, rules, sweep
from gpuvigil.node.checks import REGISTRY
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


def _modules(package: object) -> set[str]:
    prefix = package.__name__ + "."  # type: ignore[attr-defined]
    return {prefix + m.name for m in pkgutil.iter_modules(package.__path__)}  # type: ignore[attr-defined]


def test_every_probe_module_is_loaded_and_checks_are_unchanged() -> None:
    sweep.load_checks()
    assert _modules(probes) - set(sys.modules) == set()
    assert set(REGISTRY) == CHECKS_BEFORE


def test_every_rule_module_is_loaded_and_rules_are_unchanged() -> None:
    judge.load_rules()
    assert _modules(rules) - set(sys.modules) == set()
    assert set(judge.load_rules()) == RULES_BEFORE
