"""deploy/prometheus/operator: the PrometheusRule carries exactly rules.yaml's groups, and
the PodMonitors give the jobs the names the rules expect, on the ports the pods expose."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
OPERATOR = ROOT / "deploy" / "prometheus" / "operator"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"


def test_prometheusrule_matches_rules_yaml() -> None:
    rule = yaml.safe_load((OPERATOR / "prometheusrule.yaml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"], (
        "run deploy/prometheus/operator/regenerate.sh"
    )


def test_podmonitors_name_the_jobs_the_rules_expect() -> None:
    docs = list(yaml.safe_load_all((OPERATOR / "podmonitors.yaml").read_text()))
    jobs = {}
    for d in docs:
        assert d["kind"] == "PodMonitor"
        [ep] = d["spec"]["podMetricsEndpoints"]
        relabel = {r["targetLabel"]: r for r in ep["relabelings"]}
        assert "node" not in relabel  # would clash with gpuvigil_agent_info{node}
        jobs[relabel["job"]["replacement"]] = (d["spec"]["selector"]["matchLabels"], ep["port"])
    rules = RULES.read_text()
    for job in jobs:
        assert f'job="{job}"' in rules
    assert jobs["gpuvigil-agent"] == ({"app.kubernetes.io/name": "gpuvigil-agent"}, "http")
    assert jobs["gpuvigil-controller"][1] == "metrics"
    kustomization = yaml.safe_load((OPERATOR / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == ["podmonitors.yaml", "prometheusrule.yaml"]


def test_pod_ports_and_labels_match_where_the_deployments_exist() -> None:
    """Against the agent's DaemonSet and the controller's Deployment when present."""
    ds = ROOT / "deploy" / "kubernetes" / "agent" / "daemonset.yaml"
    if not ds.exists():
        return
    d = yaml.safe_load(ds.read_text())
    labels = d["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"] for c in d["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])}  # fmt: skip
    assert labels["app.kubernetes.io/name"] == "gpuvigil-agent" and "http" in ports
