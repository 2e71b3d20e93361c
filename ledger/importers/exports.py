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


def read_source(fmt: str, sources: list[str], *, start: float | None = None, interval: float | None = None,
                node: str | None = None, at: float | None = None,
                while_reading: Callable[[], None] | None = None):  # noqa: ANN201
    """Parse a telemetry export with the importers (``ledger.importers``); returns their Collected.
    ``while_reading`` runs in this process while the files are parsed (before, where they are parsed here)."""
    from . import amdsmi, dmon, nvidia_smi, prometheus
    from .common import InputError

    try:
        if fmt == "prometheus":
            return prometheus.read(sources, default_ts=at, while_reading=while_reading)
        mod = {"dmon": dmon, "amd-smi": amdsmi, "nvidia-smi": nvidia_smi}[fmt]
        if len(sources) != 1:
            raise AnalysisError(f"{fmt}: give exactly one capture file")
        if while_reading is not None:
            while_reading()
        return mod.read(sources[0], start=start, interval=interval, node=node)
    except InputError as exc:
        raise AnalysisError(str(exc)) from None
    except OSError as exc:
        raise AnalysisError(f"{getattr(exc, 'filename', '') or ''}: {exc.strerror or exc}") from None
