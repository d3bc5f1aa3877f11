"""Text from inputs made safe to print: control characters shown, never played.

Its own module, free of rich, so that a command that streams plain lines (`logscan`)
does not load the table machinery of `observe.terminal` to escape them.
"""

from __future__ import annotations

import re

# Control characters but tab and newline: a kernel log or a file name can carry escape
# sequences (`ESC [ 2 J` clears the screen, `ESC ] 0 ;` retitles the window, C1 `CSI`),
# which printed raw would act on the reader's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with every control character but tab and newline shown as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
