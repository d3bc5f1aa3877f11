"""Exec a command inside an image's root folder, as a container runtime would start a pod's
container: `python -m gpuvigil.lab.inroot SPEC -- ARGV...`, run under `unshare --mount`
(lab/image.py builds the whole line), so the mounts stay in this process's namespace and
vanish with it.

SPEC is JSON: `root` (the image's mounted root folder), `binds` ([host, path inside,
read_only]: the pod's volumes), `read_only_root` (the container's
readOnlyRootFilesystem), `uid`/`gid` (its securityContext), `env` (the image's ENV and
the container's env). The process keeps this one's PID (exec, no fork), so the lab stops
it, and everything it starts, by PID and session as it stops a host process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


def enter(spec: dict, argv: list[str]) -> None:  # type: ignore[type-arg]
    root = Path(spec["root"])
    _mount("--bind", str(root), str(root))  # a mount of its own, to remount read-only
    # outer folders first: a volume at /tmp must not hide one at /tmp/lab/machine
    for host, inside, read_only in sorted(spec["binds"], key=lambda b: len(Path(b[1]).parts)):
        target = root / inside.lstrip("/")
        if Path(host).is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch(exist_ok=True)
        _mount("--bind", host, str(target))
        if read_only:
            _mount("-o", "remount,bind,ro", str(target))
    (root / "proc").mkdir(exist_ok=True)
    _mount("-t", "proc", "proc", str(root / "proc"))
    (root / "dev").mkdir(exist_ok=True)
    _mount("--rbind", "/dev", str(root / "dev"))
    (root / "sys").mkdir(exist_ok=True)  # read-only, as a runtime mounts it
    _mount("--rbind", "/sys", str(root / "sys"))
    _mount("-o", "remount,bind,ro", str(root / "sys"))
    if spec.get("read_only_root"):
        _mount("-o", "remount,bind,ro", str(root))
    os.chroot(root)
    os.chdir("/")
    os.setgroups([])
    os.setgid(int(spec["gid"]))
    os.setuid(int(spec["uid"]))
    os.execvpe(argv[0], argv, spec["env"])


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -m gpuvigil.lab.inroot SPEC -- ARGV...")
    try:
        enter(json.loads(args[0]), args[2:])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        # the part did not start: one line, as a runtime reports CreateContainerError
        detail = getattr(e, "stderr", b"") or b""
        sys.exit(f"gpuvigil.lab.inroot: {e} {detail.decode(errors='replace').strip()}")


if __name__ == "__main__":
    main()
