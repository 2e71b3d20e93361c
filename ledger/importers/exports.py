"""A telemetry export read for analysis: the format's reader chosen by name, its errors as one line.

What ``ipledger analyze`` (and :mod:`ledger.agents.export_analysis`) read an export with. It lives with the
importers, away from the agents, so the command can start reading before the agents (pandas) are imported,
and import them while worker processes parse (``while_reading``).
"""

from __future__ import annotations

from typing import Callable

FORMATS = ("prometheus", "dmon", "amd-smi", "nvidia-smi")


class AnalysisError(ValueError):
    """An export that cannot be analysed: one line naming the file and what is wrong."""


def read_source(fmt: str | None, sources: list[str], *, start: float | None = None, interval: float | None = None,
                node: str | None = None, at: float | None = None, node_from: str | None = None,
                while_reading: Callable[[], None] | None = None):  # noqa: ANN201
    """Parse a telemetry export or a capture set (several files, a directory; ``fmt`` None: each file's format
    is sniffed) with the importers (``ledger.importers.captures``); returns one Collected.
    ``while_reading`` runs in this process while the files are parsed (before, where they are parsed here)."""
    from .captures import read_set
    from .common import InputError

    try:
        return read_set(list(sources), fmt, start=start, interval=interval, node=node, node_from=node_from, at=at,
                        while_reading=while_reading)
    except InputError as exc:
        raise AnalysisError(str(exc)) from None
    except OSError as exc:
        raise AnalysisError(f"{getattr(exc, 'filename', '') or ''}: {exc.strerror or exc}") from None
