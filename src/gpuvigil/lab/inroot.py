"""Exec a command inside an image's root folder, as a container runtime would start a pod's
container: `python -m gpuvigil.lab.inroot SPEC -- ARGV...`, run under `unshare --mount`
(lab/image.py builds the whole line), so the mounts stay in this process's namespace and
vanish with it.

SPEC is JSON: `root` (the image's mounted root folder), `binds` ([host, path inside,
read_only]: the pod's volumes), `read_only_root` (the container's
readOnlyRootFilesystem), `uid`/`gid` (its securityContext), `env` (the image's ENV and
the container's env), `capabilities` (the names the process may hold: its bounding set;
null for every one, a privileged container's) and `no_new_privs` (allowPrivilegeEscalation:
false) and `run_as_non_root` (the start fails for uid 0). `container_security` makes all
but `root`, `binds` and `env` from a manifest's securityContext. The
process keeps this one's PID (exec, no fork), so the lab stops it, and everything it
starts, by PID and session as it stops a host process.

What a runtime does that this does not (docs/lab.md "What the lab's chroot enforces"): no
seccomp profile, no PID, network, IPC or UTS namespace (the parts share the host's
loopback, which the training job's rendezvous uses), the host's /dev, no cgroup limits.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# linux/capability.h, by number: a manifest names them without the CAP_ prefix
CAPABILITIES = (
    *("CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID"),
    *("SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST"),
    *("NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO"),
    *("SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE"),
    *("SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE"),
    *("AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM"),
    *("BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"),
)
# What containerd (and so the kubelet) gives a container that is not privileged, before its
# securityContext's drop and add.
RUNTIME_DEFAULT = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
                   "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL",
                   "AUDIT_WRITE")  # fmt: skip
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def container_security(
    pod_sc: dict[str, Any], container_sc: dict[str, Any], *, image_user: int
) -> dict[str, Any]:
    """What a pod's and its container's securityContext ask of the runtime, as `Image.argv`
    takes it: uid, gid, read_only_root, capabilities, no_new_privs, run_as_non_root."""
    sc = {**pod_sc, **container_sc}  # the container's fields win, as in Kubernetes
    uid = int(sc.get("runAsUser", image_user))
    privileged = bool(container_sc.get("privileged"))
    caps = container_sc.get("capabilities") or {}
    drop = {str(c).upper().removeprefix("CAP_") for c in caps.get("drop") or []}
    add = {str(c).upper().removeprefix("CAP_") for c in caps.get("add") or []}
    keep = None if privileged else sorted(
        ({*RUNTIME_DEFAULT} - drop if "ALL" not in drop else set()) | add)  # fmt: skip
    return {
        "uid": uid,
        "gid": int(sc.get("runAsGroup", uid)),
        "read_only_root": bool(container_sc.get("readOnlyRootFilesystem")),
        "capabilities": keep,
        # Kubernetes' default is true; false is the kernel's no_new_privs bit
        "no_new_privs": container_sc.get("allowPrivilegeEscalation") is False and not privileged,
        "run_as_non_root": bool(sc.get("runAsNonRoot")),
    }


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


def _prctl(libc: ctypes.CDLL, *args: int) -> None:
    if libc.prctl(*(ctypes.c_ulong(a) for a in args)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl{args}: {os.strerror(err)}")


def _limit(libc: ctypes.CDLL, keep: list[str] | None, *, no_new_privs: bool) -> None:
    """Before setuid, while root holds CAP_SETPCAP: every capability outside `keep` leaves
    the bounding set (root's exec then gets only those; a non-root user's setuid already
    empties its effective set, and a setuid-root file can give back no more), and none is
    ambient. no_new_privs: no exec can raise privileges again (setuid files, file caps)."""
    if keep is not None:
        unknown = set(keep) - set(CAPABILITIES)
        if unknown:
            raise ValueError(f"unknown capabilities {sorted(unknown)}")
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for number in range(last + 1):
            if number >= len(CAPABILITIES) or CAPABILITIES[number] not in keep:
                _prctl(libc, PR_CAPBSET_DROP, number, 0, 0, 0)
    _prctl(libc, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if no_new_privs:
        _prctl(libc, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def enter(spec: dict, argv: list[str]) -> None:  # type: ignore[type-arg]
    if spec.get("run_as_non_root") and int(spec["uid"]) == 0:  # the kubelet's own refusal
        raise ValueError("container has runAsNonRoot and its user is 0 (root)")
    libc = ctypes.CDLL(None, use_errno=True)  # before the chroot: the host's libc
    root = Path(spec["root"])
    _mount("--bind", str(root), str(root))  # a mount of its own, to remount read-only
    # the host's /dev before the volumes: one at /dev/shm (a memory-backed emptyDir, the
    # in-memory checkpoint tier's) must sit on top of it, not be hidden by it
    (root / "dev").mkdir(exist_ok=True)
    _mount("--rbind", "/dev", str(root / "dev"))
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
    (root / "sys").mkdir(exist_ok=True)  # read-only, as a runtime mounts it
    _mount("--rbind", "/sys", str(root / "sys"))
    _mount("-o", "remount,bind,ro", str(root / "sys"))
    if spec.get("read_only_root"):
        _mount("-o", "remount,bind,ro", str(root))
    os.chroot(root)
    os.chdir("/")
    os.setgroups([])
    os.setgid(int(spec["gid"]))
    _limit(libc, spec.get("capabilities"), no_new_privs=bool(spec.get("no_new_privs")))
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
