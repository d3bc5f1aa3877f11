"""The image the manifests name is built (scripts/build-image.sh: mmdebstrap base, buildah,
vfs storage, chroot isolation; `make image`) and `gpuvigil check --expect-gpus 0 --json`
runs inside it, then preflight as the shipped PodTemplate runs it (its PyTorch is the
CPU build here), as the image's user: every check passes. The first build makes the
Debian base (minutes); later ones reuse it from ~/.cache/gpuvigil."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from testkit import require

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.realparts


def shipped_images() -> set[str]:
    found = set()
    for path in (REPO / "deploy/kubernetes").rglob("*.yaml"):
        found |= set(re.findall(r"image:\s*(ghcr\.io/\S+)", path.read_text()))
    return found


@pytest.mark.timeout(1800)
def test_image_builds_and_runs_check():
    for tool in ("buildah", "mmdebstrap"):
        require(shutil.which(tool) is not None, f"{tool} not installed (make system-deps)")
    version = re.search(r'^version = "(.*)"', (REPO / "pyproject.toml").read_text(), re.M)
    tag = f"ghcr.io/gpuvigil/gpuvigil:{version.group(1)}"
    assert shipped_images() == {tag}  # the manifests name exactly what `make image` makes
    p = subprocess.run(
        ["scripts/build-image.sh", "--test"], cwd=REPO, capture_output=True, text=True, timeout=1700
    )
    assert f"built {tag}" in p.stderr, p.stderr[-3000:]
    report = json.loads(p.stdout)
    failed = {(f["check"], f["code"]) for f in report["findings"] if f["status"] == "FAILED"}
    # As non-root in a chroot the kernel log cannot be read: that check fails closed (exit
    # 2, "could not run"); every other check runs and passes on a node without GPUs.
    assert {c for c, _ in failed} <= {"kernel_log"}, failed
    assert p.returncode == (2 if failed else 0), p.stderr[-2000:]
    assert report["status"] in ("OK", "FAILED")
    preflight_in_image(tag)
    example_in_image(tag)
    analyze_in_image(tag)
    containerfile = (REPO / "Containerfile").read_text()
    assert "USER 65532" in containerfile and containerfile.count("FROM ") == 2
    assert yaml.safe_load((REPO / "deploy/kubernetes/controller/deployment.yaml").read_text())


def example_in_image(tag: str) -> None:
    """The script the shipped training Job runs is in the image, and starts there (its
    --help: PyTorch and gpuvigil.training import), as the image's user, with what its
    training loop loads (gpuvigil.training.Run: numpy, the `training` extra; the image
    once lacked it and every rank died at its first checkpoint)."""
    import os

    job = yaml.safe_load((REPO / "deploy/kubernetes/examples/training-job.yaml").read_text())
    (ctr,) = job["spec"]["template"]["spec"]["containers"]
    script = next(a for a in ctr["args"] if a.endswith(".py"))
    cache = Path(os.environ.get("GPUVIGIL_CACHE", Path.home() / ".cache/gpuvigil"))
    store = ["--root", str(cache / "containers/storage"), "--runroot",
             str(cache / "containers/run"), "--storage-driver", "vfs"]  # fmt: skip
    c = subprocess.run(["buildah", *store, "from", "--quiet", tag], capture_output=True,
                       text=True, timeout=300, check=True).stdout.strip()  # fmt: skip
    try:
        p = subprocess.run(["buildah", *store, "run", "--isolation", "chroot", c, "--",
                            "python", script, "--help"], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
        loads = subprocess.run(["buildah", *store, "run", "--isolation", "chroot", c, "--",
                                "python", "-c", "from gpuvigil.training import Run"],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
    finally:
        subprocess.run(["buildah", *store, "rm", c], capture_output=True, timeout=120)
    assert p.returncode == 0, (script, p.stdout[-2000:], p.stderr[-2000:])
    assert "--checkpoint-dir" in p.stdout, p.stdout[-2000:]
    assert loads.returncode == 0, loads.stderr[-2000:]


def preflight_in_image(tag: str) -> None:
    """The PodTemplate's preflight command (deploy/kubernetes/preflight), on the CPU with
    no GPUs, in a container of the image, as the image's user."""
    import os

    cache = Path(os.environ.get("GPUVIGIL_CACHE", Path.home() / ".cache/gpuvigil"))
    store = ["--root", str(cache / "containers/storage"), "--runroot",
             str(cache / "containers/run"), "--storage-driver", "vfs"]  # fmt: skip
    tmpl = yaml.safe_load((REPO / "deploy/kubernetes/preflight/podtemplate.yaml").read_text())
    (main,) = tmpl["template"]["spec"]["containers"]
    args = [a for a in main["args"] if a not in ("--result-file", "/dev/termination-log")]
    argv = [*main["command"], *args, "--device", "cpu", "--expect-gpus", "0"]
    ctr = subprocess.run(["buildah", *store, "from", "--quiet", tag], capture_output=True,
                         text=True, timeout=300, check=True).stdout.strip()  # fmt: skip
    try:
        p = subprocess.run(["buildah", *store, "run", "--isolation", "chroot", ctr, "--", *argv],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        subprocess.run(["buildah", *store, "rm", ctr], capture_output=True, timeout=120)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    out = json.loads(p.stdout)
    assert out["result"] == "pass" and out["device"] == "cpu", out
    ran = {m["check"] for m in out["measurements"]}  # PyTorch ran, not DEPENDENCY_MISSING
    assert {"matmul", "memory", "bandwidth", "allreduce"} <= ran, ran


def analyze_in_image(tag: str) -> None:
    """`gpuvigil analyze` in a container of the image, as the image's user, on the shipped
    faulty node's kernel log: the image has the grep its kernel-log search runs
    (`node.checks.kernel_log.grep_lines`; without it, a slower exact fallback) and the
    verdict is the one the dev venv gives."""
    import os

    cache = Path(os.environ.get("GPUVIGIL_CACHE", Path.home() / ".cache/gpuvigil"))
    store = ["--root", str(cache / "containers/storage"), "--runroot",
             str(cache / "containers/run"), "--storage-driver", "vfs"]  # fmt: skip
    log = REPO / "examples/faulty-node/dmesg.txt"
    ctr = subprocess.run(["buildah", *store, "from", "--quiet", tag], capture_output=True,
                         text=True, timeout=300, check=True).stdout.strip()  # fmt: skip
    try:
        copy = ["buildah", *store, "copy", "--chmod", "0644", ctr, str(log), "/tmp/dmesg.txt"]
        subprocess.run(copy, capture_output=True, timeout=120, check=True)
        grep = subprocess.run(["buildah", *store, "run", "--isolation", "chroot", ctr, "--",
                               "grep", "-F", "-c", "NVRM", "/tmp/dmesg.txt"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        p = subprocess.run(["buildah", *store, "run", "--isolation", "chroot", ctr, "--",
                            "gpuvigil", "analyze", "/tmp/dmesg.txt", "--json"],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    finally:
        subprocess.run(["buildah", *store, "rm", ctr], capture_output=True, timeout=120)
    assert grep.returncode == 0 and int(grep.stdout) > 0, (grep.stdout, grep.stderr)
    here = subprocess.run([str(REPO / ".venv/bin/gpuvigil"), "analyze", str(log), "--json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == here.returncode == 1, (p.stdout[-2000:], p.stderr[-2000:])

    def verdict(text: str) -> set[tuple[str, str]]:
        out = json.loads(text)
        found = out.get("findings") or [f for r in out.get("inputs", []) for f in r.get(
            "findings", [])]  # fmt: skip
        return {(f["code"], f["status"]) for f in found}

    assert verdict(p.stdout) == verdict(here.stdout) and verdict(p.stdout), p.stdout[-2000:]
