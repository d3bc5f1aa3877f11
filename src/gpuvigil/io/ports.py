"""A loopback port for a server that binds it later (a rendezvous store, a test server).

The kernel's own choice (bind to port 0) comes from the ephemeral range, the same range
every outgoing connection takes its local port from. Between choosing the port and the
server binding it (seconds, for a torchrun agent importing torch), a client connection
can take it and the server fails with EADDRINUSE. So the port is drawn below that range,
where no outgoing connection lands, and checked bindable before it is handed out.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
FLOOR = 10000  # below it: well-known and registered services
_DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default floor of the ephemeral range
_TRIES = 200
# Ports this process handed out: a caller often draws several before any server binds one
# (etcd's two, the apiserver's, a rendezvous...), and a second draw of the same number would
# hand two servers one port. Not a lock across processes; the bind check covers those.
_given: set[int] = set()
_FORGET_AFTER = 4096  # a long-lived process (the agent's periodic preflight) starts over


def ephemeral_low(range_file: Path = RANGE_FILE) -> int:
    """The lowest port the kernel may give an outgoing connection (Linux's default when
    the file cannot be read or holds garbage)."""
    try:
        low = int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL_LOW
    return low if FLOOR + 100 < low <= 65535 else _DEFAULT_EPHEMERAL_LOW


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", *, range_file: Path = RANGE_FILE) -> int:
    """A port on `host` that binds now and lies outside the ephemeral range; the kernel's
    ephemeral pick only when that whole range is taken (it never is on a sane machine)."""
    rng = random.SystemRandom()  # two processes seeded alike would collide on every pick
    if len(_given) >= _FORGET_AFTER:
        _given.clear()
    high = ephemeral_low(range_file) - 1
    for _ in range(_TRIES):
        port = rng.randint(FLOOR, high)
        if port not in _given and bindable(port, host):
            _given.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
