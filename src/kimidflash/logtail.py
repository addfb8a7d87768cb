"""Where a supervised server's output goes, whichever runtime runs it.

serve.sh keeps the last lines for the death report, appends every line to
the log file and echoes it to the terminal; the local process and the
container runtime feed it the same way.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TextIO

TAIL_LINES = 40
STOP_GRACE_S = 30.0  # SIGTERM, then SIGKILL after this many seconds

Log = Callable[[str], None]
"""Where a command's progress lines go (print, a LogTail, a list's append): the one name every
phase, builder and engine takes its `log`/`echo` as."""


class LogTail:
    def __init__(self, log: TextIO | None, echo: Log, maxlen: int = TAIL_LINES):
        self.lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self._log, self._echo = log, echo

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        if self._log is not None:
            self._log.write(line + "\n")
            self._log.flush()
        self._echo(line)
