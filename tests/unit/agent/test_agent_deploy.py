"""The shipped deployment files agree with the code: configs validate, the NPD monitor
names real checks and every condition family, the DaemonSet and unit run `agent`."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from gpuvigil import config as gconfig
from gpuvigil.core import codes
from gpuvigil.node import checks, sweep
from testkit import cli_flags

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_shipped_agent_configs_validate():
    for path in (DEPLOY / "kubernetes/agent/agent.yaml", DEPLOY / "systemd/agent.yaml"):
        cfg = gconfig.load(path, environ={})
        assert cfg.agent.sinks.state_file.path == Path("/run/gpuvigil/report.json")
    k8s = gconfig.load(DEPLOY / "kubernetes/agent/agent.yaml", environ={})
    assert k8s.agent.sinks.kubernetes.enabled and not k8s.agent.sinks.slurm.enabled
    assert k8s.agent.sinks.kubernetes.remediation.reboot_argv[0] == "nsenter"


def test_npd_monitor_covers_every_family_with_real_checks():
    sweep.load_checks()
    monitor = json.loads((DEPLOY / "npd/gpuvigil-monitor.json").read_text())
    assert monitor["pluginConfig"]["max_output_length"] == 80
    assert {c["type"] for c in monitor["conditions"]} == set(codes.FAMILIES)
    assert {r["condition"] for r in monitor["rules"]} == set(codes.FAMILIES)
    for rule in monitor["rules"]:
        args = rule["args"]
        assert args[0] == "npd-plugin"
        names = args[1 : args.index("--family")]
        assert names and all(n in checks.REGISTRY for n in names), names
        assert args[args.index("--family") + 1] == rule["condition"]


def test_daemonset_and_unit_run_the_agent_with_its_config():
    ds = yaml.safe_load((DEPLOY / "kubernetes/agent/daemonset.yaml").read_text())
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][:1] == ["agent"] and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # every taint (gpuvigil's own, and GPU pools' others): a bare `operator: Exists`
    assert {"operator": "Exists"} in pod["tolerations"]
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/dev/kmsg", "/sys", "/run/gpuvigil"} <= mounts
    assert pod["runtimeClassName"] == "nvidia"
    unit = (DEPLOY / "systemd/gpuvigil-agent.service").read_text()
    assert "ExecStart=/usr/local/bin/gpuvigil agent --config /etc/gpuvigil/agent.yaml" in unit
    assert "Restart=always" in unit


def test_docs_list_every_agent_setting_and_flag():
    from gpuvigil.node.agent import AgentConfig, CheckSchedule
    from gpuvigil.node.kernel_watch import KernelStreamConfig
    from gpuvigil.node.sinks.http import HttpConfig
    from gpuvigil.node.sinks.kubernetes import KubernetesConfig
    from gpuvigil.node.sinks.remediation import RemediationConfig
    from gpuvigil.node.sinks.request_auth import TrustConfig
    from gpuvigil.node.sinks.slurm import SlurmConfig
    from gpuvigil.node.sinks.state_file import StateFileConfig

    doc = (DEPLOY.parent / "docs/agent.md").read_text()
    for model in (
        AgentConfig,
        CheckSchedule,
        KernelStreamConfig,
        HttpConfig,
        KubernetesConfig,
        RemediationConfig,
        SlurmConfig,
        StateFileConfig,
        TrustConfig,
    ):
        for name, field in model.model_fields.items():
            assert f"| `{name}` |" in doc, f"{model.__name__}.{name} missing in docs/agent.md"
            assert field.description, f"{model.__name__}.{name} has no description"
    for flag in cli_flags("agent"):
        assert f"`{flag}" in doc, flag
