"""The shipped security manifests have the shape their API expects, and say what they
promise: the 1.30+ admission policy (which the tests' 1.20 API server cannot run, so its
shape and its CEL expressions' structure are checked here), the default deploy's
node-identity patches, least-privilege RBAC, the placement knobs and the systemd unit's
writable paths."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_admission_policy_shape():
    policy, binding = docs(DEPLOY / "kubernetes/admission/agent-own-node.yaml")
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["kind"] == "ValidatingAdmissionPolicy"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes", "nodes/status"] and rule["operations"] == ["UPDATE"]
    assert "gpuvigil:gpuvigil-agent" in spec["matchConditions"][0]["expression"]
    names = {v["name"] for v in spec["variables"]}
    for v in spec["validations"]:
        assert set(v) <= {"expression", "message", "reason", "messageExpression"}
        assert v["reason"] == "Forbidden" and v["message"]
        for ref in re.findall(r"variables\.(\w+)", v["expression"]):
            assert ref in names, ref
        assert v["expression"].count("(") == v["expression"].count(")")
    text = " ".join(v["expression"] for v in spec["validations"])
    assert "authentication.kubernetes.io/node-name" in " ".join(
        v["expression"] for v in spec["variables"]
    )
    assert "object.metadata.name" in text and "object.spec == oldObject.spec" in text
    assert binding["kind"] == "ValidatingAdmissionPolicyBinding"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    # The default kustomization stays appliable to older API servers.
    top = yaml.safe_load((DEPLOY / "kubernetes/kustomization.yaml").read_text())
    assert "admission" not in top["resources"]


def test_least_privilege_rbac():
    (agent_role, _) = docs(DEPLOY / "kubernetes/agent/rbac.yaml")
    rules = {(tuple(r["resources"]), tuple(r["verbs"])) for r in agent_role["rules"]}
    assert rules == {
        (("nodes",), ("get",)),
        (("nodes/status",), ("patch",)),
        (("events",), ("create",)),
    }
    (sa,) = docs(DEPLOY / "kubernetes/preflight/rbac.yaml")
    assert sa["kind"] == "ServiceAccount" and sa["automountServiceAccountToken"] is False
    # The default deploy's agent talks as its node: its account keeps no binding.
    top = yaml.safe_load((DEPLOY / "kubernetes/kustomization.yaml").read_text())
    assert top["patchesStrategicMerge"] == [
        "node-identity/agent-as-node.yaml",
        "node-identity/agent-rbac-none.yaml",
    ]
    (unbind,) = docs(DEPLOY / "kubernetes/node-identity/agent-rbac-none.yaml")
    assert unbind["$patch"] == "delete" and unbind["kind"] == "ClusterRoleBinding"
    (ds,) = docs(DEPLOY / "kubernetes/node-identity/agent-as-node.yaml")
    pod = ds["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "--kubeconfig" in pod["containers"][0]["args"]
    overlay = yaml.safe_load(
        (DEPLOY / "kubernetes/overlays/service-account/kustomization.yaml").read_text()
    )
    assert "../../agent" in overlay["resources"] and "patchesStrategicMerge" not in overlay


def test_placement_is_configurable_and_reaches_every_gpu_pool():
    ds = yaml.safe_load((DEPLOY / "kubernetes/agent/daemonset.yaml").read_text())
    assert ds["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
    dep = yaml.safe_load((DEPLOY / "kubernetes/controller/deployment.yaml").read_text())
    aff = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in aff  # all-GPU clusters
    tmpl = yaml.safe_load((DEPLOY / "kubernetes/preflight/podtemplate.yaml").read_text())
    assert tmpl["template"]["spec"]["restartPolicy"] == "Never"


def test_systemd_unit_limits_writable_paths():
    unit = (DEPLOY / "systemd/gpuvigil-agent.service").read_text()
    assert "ProtectSystem=strict" in unit
    assert "ReadWritePaths=/run/gpuvigil /var/lib/gpuvigil" in unit
