"""A progress bar on stderr for long exports and analyses: drawn only when stderr is a terminal, never with
``--quiet``, and never on stdout (which may carry JSON)."""

from __future__ import annotations

import sys
import time
from typing import IO


class Progress:
    """``Progress(label)(done, total)``: a callback; ``total`` 0 means unknown (a counter is shown)."""

    def __init__(self, label: str, *, quiet: bool = False, stream: IO[str] | None = None,
                 min_interval: float = 0.1) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval = min_interval
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int = 0) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.min_interval and not (total and done >= total):
            return
        self._last = now
        if total:
            width = 30
            filled = int(width * min(done, total) / total)
            text = f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        else:
            text = f"\r{self.label} {done} ..."
        self.stream.write(text)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
