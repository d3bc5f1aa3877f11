"""The image the manifests name is built (scripts/build-image.sh: mmdebstrap base, buildah,
vfs storage, chroot isolation; `make image`) and `gpuvigil check --expect-gpus 0 --json`
runs inside it. The first build makes the Debian base (minutes); later ones reuse it from
~/.cache/gpuvigil."""

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
    containerfile = (REPO / "Containerfile").read_text()
    assert "USER 65532" in containerfile and containerfile.count("FROM ") == 2
    assert yaml.safe_load((REPO / "deploy/kubernetes/controller/deployment.yaml").read_text())
