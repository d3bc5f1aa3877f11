"""Sleep until a file changes: inotify where the kernel offers it, else a plain sleep.

Called by the kernel-log stream's file source (`kmsg_stream.FollowFile`): with inotify the
reader wakes when the file is written, truncated, deleted or replaced (a watch on the
file and one on its folder), instead of polling twice a second; an idle agent then costs
one wake per liveness beat. Linux only, through libc (ctypes); any failure to set up a
watch falls back to sleeping, which only costs CPU.
"""

from __future__ import annotations

import ctypes
import os
import select
import time
from pathlib import Path

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_TO, IN_CREATE, IN_DELETE_SELF, IN_MOVE_SELF = 0x80, 0x100, 0x400, 0x800
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
FILE_EVENTS = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
DIR_EVENTS = IN_CREATE | IN_MOVED_TO  # a new file under the watched name: replaced


class FileWatch:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        try:
            self._libc = ctypes.CDLL(None, use_errno=True)
            fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        self.fd = fd
        if not (self._add(path.parent, DIR_EVENTS) and self.rewatch()):
            self.close()

    @property
    def active(self) -> bool:
        return self.fd is not None

    def _add(self, path: Path, mask: int) -> bool:
        if self.fd is None:
            return False
        return self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask) >= 0

    def rewatch(self) -> bool:
        """Watch the file now at `path` (after it was replaced); False if it is absent."""
        return self._add(self.path, FILE_EVENTS)

    def wait(self, timeout_s: float) -> None:
        """Until the file or its folder changes, or `timeout_s` passed."""
        if self.fd is None:
            time.sleep(timeout_s)
            return
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if ready:
            try:
                while os.read(self.fd, 65536):  # drain: the reader looks at the file itself
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
