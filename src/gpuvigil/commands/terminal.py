"""Text that reaches a terminal: control characters from captured files made visible.

A kernel log or a file name can carry escape sequences (`ESC [ 2 J` clears the screen,
`ESC ] 0 ;` retitles the window, C1 `CSI`); printed raw they would act on the reader's
terminal. Every string from an input goes through `printable` before a table shows it.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character but tab and newline shown as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
