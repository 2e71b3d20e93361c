"""The one progress bar of every long command: ``click.progressbar`` on stderr, drawn only when stderr is a
terminal, never with ``--quiet`` or ``--json``, and never on stdout (which may carry JSON or a file).

Two ways to drive it, both through :class:`Progress`:

* as a ``(done, total)`` callback, for library calls that count their own work (``issue``, ``export monthly``,
  ``ship``, imports);
* as named steps (:meth:`Progress.step`), for commands made of a few long calls that do not count
  (``verify``, ``findings``, ``explain``, ``ask``, ``account``, ``report analysis``, ``demo``): the bar counts
  the steps done and names the one running.

When it is not drawn it prints nothing at all: no label, no newline.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

import click


def on_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or file-less stream
        return False


class Progress:
    """``Progress(label)(done, total)`` draws ``label [####....] done/total``; ``total`` 0 means unknown (a
    counter is shown). ``Progress(label, steps=N)`` with :meth:`step` counts N named steps. Use it as a context
    manager (or call :meth:`close`) so the terminal line is ended."""

    def __init__(self, label: str, *, quiet: bool = False, steps: int = 0, stream: IO[str] | None = None,
                 min_interval: float = 0.1) -> None:
        self.label = label
        self.min_interval = min_interval
        self._last = 0.0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = not quiet and on_terminal(self.stream)
        self.steps = steps
        self._done_steps = 0
        self._bar: Any = None
        self._total = 0
        self._pos = 0
        self._counter = False

    # -- a (done, total) callback -----------------------------------------------------------------------------
    def __call__(self, done: int, total: int = 0) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.min_interval and not (total and done >= total):
            return  # a terminal redrawn at most ten times a second, and always at the end
        self._last = now
        if not total:
            self.stream.write(f"\r{self.label} {done} ...")
            self.stream.flush()
            self._counter = True
            return
        if self._bar is None or total != self._total:
            self._finish_bar()
            self._bar = click.progressbar(length=total, label=self.label, file=self.stream, show_pos=True,
                                          show_percent=False, show_eta=False, width=30)
            self._bar.__enter__()
            self._total, self._pos = total, 0
        done = min(done, total)
        if done > self._pos:
            self._bar.update(done - self._pos)
            self._pos = done
        if done >= total:  # the line is ended here, so a callback nobody closes leaves the terminal tidy
            self._finish_bar()

    # -- named steps ------------------------------------------------------------------------------------------
    def step(self, what: str) -> None:
        """Mark the previous step done and name the next one (``label: what [##..] 1/3``)."""
        if not self.enabled or not self.steps:
            return
        if self._bar is None:
            self._bar = click.progressbar(length=self.steps, label=f"{self.label}: {what}", file=self.stream,
                                          show_pos=True, show_percent=False, show_eta=False, width=20)
            self._bar.__enter__()
            self._total, self._pos = self.steps, 0
            self._bar.render_progress()
            return
        self._bar.label = f"{self.label}: {what}"
        self._done_steps += 1
        self._bar.update(1)

    # -- ending -----------------------------------------------------------------------------------------------
    def _finish_bar(self) -> None:
        if self._bar is None:
            return
        if self.steps and self._done_steps < self.steps:  # every step ran: the bar ends at N/N
            self._bar.update(self.steps - self._done_steps)
            self._done_steps = self.steps
        self._bar.__exit__(None, None, None)
        self._bar = None

    def close(self, complete: bool = True) -> None:
        """End the terminal line; ``complete``: a step bar is shown with every step done (not after an error)."""
        if not self.enabled:
            return
        if not complete and self.steps:
            self._done_steps = self.steps  # leave the bar where the error stopped it
        self._finish_bar()
        if self._counter:
            self.stream.write("\n")
            self.stream.flush()
            self._counter = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(complete=exc_type is None)


def progress_for(label: str, quiet: bool = False) -> "Progress | None":
    """A ``(done, total)`` callback for a library call, or None when nothing would be drawn (the call then skips
    its progress work entirely)."""
    bar = Progress(label, quiet=quiet)
    return bar if bar.enabled else None
