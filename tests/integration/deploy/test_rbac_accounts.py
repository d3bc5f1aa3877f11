"""Each shipped ServiceAccount may do what gpuvigil's code does with it, and nothing more,
on a real kube-apiserver 1.20 with the manifests applied by the real kubectl.

`USES` is the list the issue asks for: per account, per namespace, every (verb, resource,
name) the code calls (`platform/clusters/*`, `platform/leader.py` for the controller;
`node/sinks/kubernetes.py` for the agent; nothing for preflight). Each one must be a `yes`
from `kubectl auth can-i --as=<account>`, and the account's whole rule list
(`kubectl auth can-i --list`) must hold nothing that `USES` does not: a verb the RBAC grants
and no code uses is a failure too, as is a verb the code uses and the RBAC lacks (the
controller's missing `watch nodes` was one).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.realparts
DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
DRA_CRDS = Path(__file__).resolve().parents[1] / "controller/fixtures/dra_crds.yaml"
DRA = "resource.k8s.io"
NS = "gpuvigil"
CONTROLLER = f"system:serviceaccount:{NS}:gpuvigil-controller"
AGENT = f"system:serviceaccount:{NS}:gpuvigil-agent"
PREFLIGHT = f"system:serviceaccount:{NS}:gpuvigil-preflight"

Use = tuple[str, str, str]  # (verb, resource[/subresource][.group], resource name or "")

CLUSTER_WIDE_CONTROLLER: list[Use] = [
    ("get", "nodes", ""),  # k8s_preflight: the validation's node
    ("list", "nodes", ""),  # k8s_watch: the LIST
    ("watch", "nodes", ""),  # k8s_watch: the WATCH
    ("patch", "nodes", ""),  # taints, state record, requests
    ("delete", "nodes", ""),  # replace: delete-node
    ("list", "pods", ""),  # running work per node
    ("delete", "pods", ""),  # what is left at the drain deadline
    ("create", "pods/eviction", ""),
    ("patch", "pods/status", ""),  # DisruptionTarget
    ("create", "events", ""),
    # serving pools (clusters/k8s_serving.py)
    ("patch", "nodes/status", ""),  # HeldForCapacity
    ("get", "deployments.apps", ""),  # the workload: selector, make-before-break mark
    ("patch", "deployments.apps", ""),
    ("get", "statefulsets.apps", ""),
    ("patch", "statefulsets.apps", ""),
    ("get", "deployments.apps/scale", ""),  # demand (scale) and make-before-break
    ("patch", "deployments.apps/scale", ""),
    ("get", "statefulsets.apps/scale", ""),
    ("patch", "statefulsets.apps/scale", ""),
    ("get", "horizontalpodautoscalers.autoscaling", ""),  # demand, maxReplicas, the floor
    ("patch", "horizontalpodautoscalers.autoscaling", ""),
    # k8s_dra: per-GPU isolation with DRA (the rule written, read back, deleted)
    ("list", "resourceslices.resource.k8s.io", ""),
    ("list", "resourceclaims.resource.k8s.io", ""),
    ("get", "devicetaintrules.resource.k8s.io", ""),
    ("create", "devicetaintrules.resource.k8s.io", ""),
    ("patch", "devicetaintrules.resource.k8s.io", ""),
    ("delete", "devicetaintrules.resource.k8s.io", ""),
]
USES: dict[str, dict[str, list[Use]]] = {
    CONTROLLER: {
        "default": CLUSTER_WIDE_CONTROLLER,
        NS: [
            *CLUSTER_WIDE_CONTROLLER,
            ("get", "leases.coordination.k8s.io", ""),
            ("create", "leases.coordination.k8s.io", ""),
            ("update", "leases.coordination.k8s.io", ""),
            ("get", "podtemplates", "gpuvigil-preflight"),
            ("create", "pods", ""),  # a preflight run
            ("create", "secrets", ""),  # its signing key, once
            ("get", "secrets", "gpuvigil-controller-key"),
            ("create", "configmaps", ""),
            ("get", "configmaps", "gpuvigil-trust"),
            ("update", "configmaps", "gpuvigil-trust"),
        ],
    },
    # The default deploy's agent talks as its node (deploy/kubernetes/node-identity: the
    # Node authorizer keeps it to its own Node); its ServiceAccount may do nothing.
    AGENT: {"default": [], NS: []},
    PREFLIGHT: {"default": [], NS: []},
}
# A few it must be refused, asked one by one (the rule list above covers all the rest).
REFUSED: dict[str, list[tuple[str, Use]]] = {
    CONTROLLER: [
        ("default", ("create", "pods", "")),
        ("default", ("get", "pods", "")),
        ("default", ("list", "secrets", "")),
        (NS, ("get", "secrets", "another-secret")),
        (NS, ("update", "configmaps", "gpuvigil-agent")),
        ("default", ("update", "leases.coordination.k8s.io", "")),
        (NS, ("delete", "deployments.apps", "")),
        ("default", ("update", "deployments.apps/scale", "")),
        ("default", ("create", "horizontalpodautoscalers.autoscaling", "")),
        ("default", ("update", "nodes", "")),
        ("default", ("update", "devicetaintrules.resource.k8s.io", "")),
        ("default", ("list", "devicetaintrules.resource.k8s.io", "")),
        ("default", ("create", "resourceslices.resource.k8s.io", "")),
    ],
    AGENT: [
        ("default", ("get", "nodes", "")),
        ("default", ("patch", "nodes/status", "")),
        ("default", ("create", "events", "")),
        ("default", ("patch", "nodes", "")),
        ("default", ("list", "nodes", "")),
        ("default", ("watch", "nodes", "")),
        ("default", ("list", "pods", "")),
        (NS, ("get", "secrets", "gpuvigil-controller-key")),
        (NS, ("get", "configmaps", "gpuvigil-trust")),
    ],
    PREFLIGHT: [
        ("default", ("get", "nodes", "")),
        ("default", ("patch", "nodes/status", "")),
        (NS, ("list", "pods", "")),
        ("default", ("create", "events", "")),
    ],
}
# What every authenticated user may do (system:basic-user): not gpuvigil's to grant or drop.
EVERYONE = {"selfsubjectaccessreviews.authorization.k8s.io",
            "selfsubjectrulesreviews.authorization.k8s.io"}  # fmt: skip


# overlays/service-account: the agent talks as its ServiceAccount (node/sinks/kubernetes.py)
AGENT_SA_USES: dict[str, list[Use]] = {
    ns: [("get", "nodes", ""), ("patch", "nodes/status", ""), ("create", "events", "")]
    for ns in ("default", NS)
}


@pytest.fixture(scope="module")
def applied(kube: Any) -> Iterator[Any]:
    out = kube.kubectl("apply", "-k", str(DEPLOY))
    assert out.returncode == 0, out.stderr
    # as on a fresh cluster: an earlier module's service-account overlay left its binding
    kube.kubectl("delete", "clusterrolebinding", "gpuvigil-agent", "--ignore-not-found")
    # The DRA kinds served (CRDs of their shape, as test_k8s_dra.py): `kubectl auth can-i`
    # asks about a resource it cannot discover in group "" (so: no); the rule list is the
    # same either way, since RBAC names resources whether they are served or not.
    out = kube.kubectl("apply", "-f", str(DRA_CRDS))
    assert out.returncode == 0, out.stderr
    end = time.monotonic() + 30
    while "devicetaintrules" not in kube.kubectl("api-resources", f"--api-group={DRA}").stdout:
        assert time.monotonic() < end, "the DRA CRDs are not served"
        time.sleep(0.2)
    yield kube
    kube.kubectl("delete", "-f", str(DRA_CRDS), "--ignore-not-found")


def can(kube: Any, account: str, ns: str, use: Use) -> bool:
    verb, res, name = use
    res, _, sub = res.partition("/")
    args = [res + (f"/{name}" if name else "")]
    if sub:
        args.append(f"--subresource={sub}")
    out = kube.kubectl("auth", "can-i", verb, *args, "-n", ns, f"--as={account}")
    assert out.stdout.strip() in ("yes", "no"), out.stderr
    return out.stdout.strip() == "yes"


def granted(kube: Any, account: str, ns: str) -> set[Use]:
    """The account's whole rule list in `ns`, from `kubectl auth can-i --list`."""
    out = kube.kubectl("auth", "can-i", "--list", "-n", ns, f"--as={account}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    head = lines[0]
    cols = [head.index(c) for c in ("Resources", "Non-Resource URLs", "Resource Names", "Verbs")]
    rules: set[Use] = set()
    for line in lines[1:]:
        res = line[cols[0] : cols[1]].strip()
        urls = line[cols[1] : cols[2]].strip()
        names = line[cols[2] : cols[3]].strip().strip("[]").split()
        verbs = line[cols[3] :].strip().strip("[]").split()
        if not res or urls not in ("", "[]") or res in EVERYONE:
            continue
        for verb in verbs:
            for name in names or [""]:
                rules.add((verb, res, name))
    return rules


@pytest.mark.parametrize("account", list(USES), ids=["controller", "agent", "preflight"])
def test_each_account_may_do_what_its_code_does_and_nothing_more(applied, account) -> None:  # type: ignore[no-untyped-def]
    kube = applied
    for ns, uses in USES[account].items():
        for use in uses:
            assert can(kube, account, ns, use), f"{account} in {ns}: no to {use}, which code uses"
        extra = granted(kube, account, ns) - set(uses)
        assert not extra, f"{account} in {ns} may also {sorted(extra)}, which no code uses"
    for ns, use in REFUSED[account]:
        assert not can(kube, account, ns, use), f"{account} in {ns}: yes to {use}"


def test_the_service_account_overlays_agent_may_do_what_its_code_does(applied) -> None:  # type: ignore[no-untyped-def]
    kube = applied
    out = kube.kubectl("apply", "-k", str(DEPLOY / "overlays/service-account"))
    assert out.returncode == 0, out.stderr
    for ns, uses in AGENT_SA_USES.items():
        for use in uses:
            assert can(kube, AGENT, ns, use), f"{AGENT} in {ns}: no to {use}, which code uses"
        extra = granted(kube, AGENT, ns) - set(uses)
        assert not extra, f"{AGENT} in {ns} may also {sorted(extra)}, which no code uses"
    for ns, use in REFUSED[AGENT][3:]:
        assert not can(kube, AGENT, ns, use), f"{AGENT} in {ns}: yes to {use}"
