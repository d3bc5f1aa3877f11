"""The built image (`make image`: ghcr.io/gpuvigil/gpuvigil:<version>) as the lab runs a
part from it: one buildah container of the image, its root mounted, and each process
started in that root under a mount namespace of its own (`lab/inroot.py`) with the
manifest's user, read-only root, volumes and env. The files that run are the image's,
as the image's user: what the shipped Deployment would start, not the host's venv.

Storage is the one scripts/build-image.sh writes (vfs under ~/.cache/gpuvigil/containers).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpuvigil
from gpuvigil import __version__
from gpuvigil.lab.inroot import container_security

TAG = f"ghcr.io/gpuvigil/gpuvigil:{__version__}"  # what the manifests name
IMAGE_PYTHON = "/opt/gpuvigil/bin/python"  # the Containerfile's venv
IMAGE_USER = 65532  # the Containerfile's USER


def _store() -> list[str]:
    cache = Path(os.environ.get("GPUVIGIL_CACHE", Path.home() / ".cache/gpuvigil"))
    return ["--root", str(cache / "containers/storage"), "--runroot",
            str(cache / "containers/run"), "--storage-driver", "vfs"]  # fmt: skip


def _buildah(*args: str, timeout: float = 300) -> str:
    p = subprocess.run(["buildah", *_store(), *args], capture_output=True, text=True,
                       timeout=timeout, check=False)  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"buildah {args[0]}: {p.stderr.strip()[-500:]}")
    return p.stdout.strip()


def _digests(package: Path) -> dict[str, str]:
    return {
        str(f.relative_to(package)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in package.rglob("*")
        if f.is_file() and "__pycache__" not in f.parts
    }


def missing(tag: str = TAG) -> str | None:
    """Why the lab cannot run its parts from the image (one line naming the fix), or None."""
    for tool, package in (("buildah", "buildah"), ("unshare", "util-linux"), ("mount", "mount")):
        if shutil.which(tool) is None:
            return f"{tool} not installed: run `make system-deps` (Debian {package})"
    try:
        _buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", tag, timeout=60)
    except (RuntimeError, subprocess.TimeoutExpired):
        return f"{tag} not built: run `make image`"
    return None


@dataclass
class Image:
    tag: str
    container: str
    root: Path
    digest: str  # the image's manifest digest (sha256:...)
    env: dict[str, str]  # the image's ENV

    @classmethod
    def open(cls, tag: str = TAG) -> Image:
        """A container of `tag` with its root mounted; `close()` removes it."""
        ctr = _buildah("from", "--quiet", "--pull-never", tag)
        opened = False
        try:
            root = Path(_buildah("mount", ctr))
            digest = _buildah("inspect", "--format", "{{.FromImageDigest}}", ctr)
            each_env = "{{range .OCIv1.Config.Env}}{{println .}}{{end}}"
            env_lines = _buildah("inspect", "--type", "image", "--format", each_env, tag)
            opened = True
        finally:
            if not opened:  # the failure itself goes on up: only the container is undone
                _buildah("rm", ctr)
        env = dict(line.split("=", 1) for line in env_lines.splitlines() if "=" in line)
        return cls(tag, ctr, root, digest, env)

    def differs(self) -> list[str]:
        """The files of the gpuvigil package that differ between the image and the code
        running this lab (added, removed or changed; [] when they are the same): an image
        built before the last edit would run other code than the one under test."""
        here = Path(gpuvigil.__file__).parent
        inside = sorted(self.root.glob("opt/gpuvigil/lib/python3*/site-packages/gpuvigil"))
        if not inside:
            return ["gpuvigil (not installed in the image)"]
        a, b = _digests(here), _digests(inside[0])
        return sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))

    def close(self) -> None:
        try:
            _buildah("rm", self.container, timeout=120)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass  # a container left behind is buildah's to list, never the lab's failure

    @staticmethod
    def security(pod_sc: dict[str, Any], container_sc: dict[str, Any]) -> dict[str, Any]:
        """`argv`'s uid, gid, read_only_root, capabilities, no_new_privs and
        run_as_non_root for a container of this image with these securityContexts (the
        pod's, the container's)."""
        return container_security(pod_sc, container_sc, image_user=IMAGE_USER)

    def argv(
        self,
        argv: list[str],
        *,
        uid: int,
        gid: int,
        binds: list[tuple[str, str, bool]],
        env: dict[str, str],
        read_only_root: bool,
        capabilities: list[str] | None = None,
        no_new_privs: bool = False,
        run_as_non_root: bool = False,
    ) -> list[str]:
        """The host command that runs `argv` in the image's root as a container would
        (uid, gid and the last four arguments: `security()` of its securityContext;
        `capabilities` None: every one, as privileged)."""
        spec = {"root": str(self.root), "binds": binds, "uid": uid, "gid": gid,
                "env": {**self.env, **env}, "read_only_root": read_only_root,
                "capabilities": capabilities, "no_new_privs": no_new_privs,
                "run_as_non_root": run_as_non_root}  # fmt: skip
        return ["unshare", "--mount", "--propagation", "private", sys.executable, "-m",
                "gpuvigil.lab.inroot", json.dumps(spec), "--", *argv]  # fmt: skip
