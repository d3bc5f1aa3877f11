"""docs/security.md "How each pod runs" is true of the manifests, and the agent has what its
code needs: root with every capability (privileged) for /dev/kmsg, GPU resets and the
nsenter reboot, hostPID for the reboot, the /dev/kmsg and state hostPath mounts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy" / "kubernetes"


def image_user() -> int:
    users = re.findall(r"^USER\s+(\d+)", (ROOT / "Containerfile").read_text(), re.M)
    return int(users[-1])


def doc_rows() -> dict[str, dict[str, str]]:
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("## How each pod runs", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        row = dict(zip(head, cells, strict=True))
        rows[row["pod"]] = row
    return rows


def pod_spec(manifest: str) -> dict[str, Any]:
    # a row names its manifest under deploy/kubernetes, or from the repository's root
    # where a bare path would read as a root folder's (examples/ is both)
    path = manifest.strip("`").removeprefix("deploy/kubernetes/")
    doc = yaml.safe_load((DEPLOY / path).read_text())
    if doc["kind"] == "PodTemplate":
        return doc["template"]["spec"]  # type: ignore[no-any-return]
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def how_it_runs(spec: dict[str, Any]) -> dict[str, Any]:
    (container,) = spec["containers"]
    pod_sc, sc = spec.get("securityContext") or {}, container.get("securityContext") or {}
    user = sc.get("runAsUser", pod_sc.get("runAsUser", image_user()))
    privileged = bool(sc.get("privileged"))
    caps = sc.get("capabilities") or {}
    if privileged:
        capabilities = "all"
    elif caps.get("drop") == ["ALL"] and not caps.get("add"):
        capabilities = "none"
    else:
        capabilities = ",".join(caps.get("add") or [])
    return {"user": user, "privileged": privileged, "capabilities": capabilities,
            "hostPID": bool(spec.get("hostPID"))}  # fmt: skip


def test_the_doc_table_is_true_of_every_pod_manifest() -> None:
    rows = doc_rows()
    assert set(rows) == {"agent", "controller", "preflight", "training"}
    for pod, row in rows.items():
        got = how_it_runs(pod_spec(row["manifest"]))
        said = {
            "user": int(row["user"].split()[0]),
            "privileged": row["privileged"] == "yes",
            "capabilities": row["capabilities"].split()[0],
            "hostPID": row["hostPID"] == "yes",
        }
        assert got == said, f"docs/security.md says {pod} runs {said}; its manifest: {got}"


def test_the_agent_has_what_kmsg_reset_and_reboot_need() -> None:
    spec = pod_spec("agent/daemonset.yaml")
    got = how_it_runs(spec)
    # a non-root process in a privileged container has no capabilities: root is the point
    assert got["user"] == 0 and got["privileged"] and got["hostPID"], got
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert {"/dev/kmsg", "/run/gpuvigil", "/var/lib/gpuvigil"} <= mounts
    # and the reboot the agent runs is the one hostPID makes reach the host
    cfg = yaml.safe_load((DEPLOY / "agent" / "agent.yaml").read_text())
    argv = cfg["agent"]["sinks"]["kubernetes"]["remediation"]["reboot_argv"]
    assert argv[:3] == ["nsenter", "--target", "1"], argv


def test_controller_preflight_and_training_stay_unprivileged() -> None:
    for manifest in (
        "controller/deployment.yaml",
        "preflight/podtemplate.yaml",
        "examples/training-job.yaml",
    ):
        got = how_it_runs(pod_spec(manifest))
        assert got["user"] != 0 and not got["privileged"] and got["capabilities"] == "none"
