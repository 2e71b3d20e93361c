"""an export analysed in one shot: run every agent over a telemetry export.

:func:`analyze_collected` is the library call behind ``ipledger analyze``; it returns the
:class:`~ledger.agents.Analysis` whose ``to_json()`` the reports engineer's ``reports.analysis_pdf.render`` lays out.
By default the agents read the parsed export directly (:mod:`ledger.agents.memory`); with ``keep`` the export
is imported into a SQLite ledger at that path and the agents read it back (the same analysis, tested).
Nothing is written anywhere else.

They run over the export's device-hours with the raw samples their findings need
(:func:`ledger.agents.hourly.compact_dataset`: memory grows with devices x hours plus 8 B a measured value), or
over every sample (``samples=True``: the full-resolution reference, a per-sample frame of ≈ 380 B a sample and the
agents' work over it). tests/test_analyze.py holds the two to the same findings. By default (``samples=None``) an
export whose per-sample frame fits :data:`SAMPLE_FRAME_BUDGET` is read sample by sample — there the device-hours
save no memory worth having and cost a second pass (a 24-hour capture set of 64 GPUs at 15 s, 368,640 samples:
3.1 CPU-s over device-hours, 2.2 over every sample, the same analysis) — and a larger one over device-hours.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from ..importers.exports import FORMATS, AnalysisError, read_source
from . import Analysis, method_info, run_agents
from .common import label_equals
from .data import Dataset, load

__all__ = ["FORMATS", "AnalysisError", "analyze_collected", "read_source", "render_pdf"]

SAMPLE_FRAME_BUDGET = 256 << 20   # bytes: the largest per-sample frame the default reads (≈ 700,000 samples)
SAMPLE_FRAME_BYTES = 380          # the per-sample frame's bytes a sample (docs/scale.md)


def sample_count_bound(collected) -> int:  # noqa: ANN001 - a Collected
    """The rows of the export's per-sample frame, at most: each device's longest series, summed."""
    return sum(max((len(ts) for ts, _vs in fields.values()), default=0) for fields in collected.series.values())


def reads_every_sample(collected) -> bool:  # noqa: ANN001 - a Collected
    """Whether the default analysis of this export runs over every sample (its frame within the budget)."""
    return sample_count_bound(collected) * SAMPLE_FRAME_BYTES <= SAMPLE_FRAME_BUDGET


def analyze_collected(collected, keep: Path | None = None, cluster: str = "pathb",  # noqa: ANN001
                      topology: dict | None = None, sources: list[str] | None = None,
                      progress: Callable[[int, int], None] | None = None, consume: bool = False,
                      samples: bool | None = None, lanes: int = 2) -> Analysis:
    """The analysis of a parsed export (see the module doc). ``consume``: the caller is done with
    ``collected``; its values are dropped device by device while the agents' samples are built (it keeps its
    devices, contexts and report), so a large export is not held twice. ``samples``: every agent over every
    sample (True) or over device-hours (False); None: over every sample where the frame fits
    :data:`SAMPLE_FRAME_BUDGET` (:func:`reads_every_sample`). ``lanes``: over every sample, the agents run in
    this many processes (:func:`ledger.agents.lanes.run_agents_in_lanes`: 2, or 1 for the one-process reference;
    the same analysis)."""
    from ..importers import pipeline

    digests = _digests_meanwhile(sources or [])
    if not collected.series:
        raise AnalysisError(f"{collected.path}: no telemetry this importer maps (see docs/telemetry.md)")
    if samples is None:
        samples = reads_every_sample(collected)
    opts = pipeline.ImportOptions(cluster=cluster)
    if keep is None and samples:  # no ledger asked for: the agents run on the parsed export directly
        from .memory import dataset_from_collected

        from .lanes import run_agents_in_lanes

        ds, res = dataset_from_collected(collected, opts, topology=topology, progress=progress, release=consume)
        digests()   # the digests' thread done before a lane is forked
        return _finish(run_agents_in_lanes(ds, lanes), collected, res, sources, digests, ds)
    if keep is None:
        from ..base.heap import return_freed_heap
        from . import hourly
        from .memory import hourly_from_collected

        scan, src, res = hourly_from_collected(collected, opts, progress=progress, release=consume)
        ds = hourly.compact_dataset(scan, src, topology, detail=True)
        del src   # the export's raw columns: what the agents need of them is in the dataset now
        return_freed_heap()
        return _finish(run_agents(ds), collected, res, sources, digests, ds)
    from ..chain import db as db_mod
    from . import hourly

    if keep.exists():
        keep.unlink()
    engine = db_mod.make_engine(f"sqlite:///{keep}")
    try:
        db_mod.upgrade(engine)
        res = pipeline.write(engine, collected, opts, progress=progress)
        ds = load(engine, topology=topology) if samples else hourly.load_compact(engine, topology=topology,
                                                                                 detail=True)
    finally:
        engine.dispose()
    return _finish(run_agents(ds), collected, res, sources, digests, ds)


def _digests_meanwhile(sources: list[str]) -> Callable[[], dict[str, str]]:
    """The sha256 of each source file, computed in a thread while the agents run (hashlib releases the GIL
    while it hashes); the returned function waits for them, and raises what reading a file raised."""
    import threading

    out: dict[str, str] = {}
    failed: list[BaseException] = []

    def work() -> None:
        try:
            for s in sources:
                p = Path(s)
                if p.is_file():
                    with p.open("rb") as f:   # a digest of a file of gigabytes, a MiB at a time
                        out[s] = hashlib.file_digest(f, "sha256").hexdigest()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failed.append(exc)

    thread = threading.Thread(target=work, name="source-digests", daemon=True)
    thread.start()

    def result() -> dict[str, str]:
        thread.join()
        if failed:
            raise failed[0]
        return out
    return result


def _finish(analysis: Analysis, collected, res, sources: list[str] | None,  # noqa: ANN001
            digests: Callable[[], dict[str, str]], ds: Dataset) -> Analysis:
    # the samples analysed are the export's, whichever rows (samples or device-hours) the agents' frame held
    analysis.meta["samples"] = res.samples
    analysis.context = _context(collected, res, analysis, sources or [], digests())
    analysis.context["series"] = finding_series(ds, analysis.findings)
    from .effective import effective_compute

    analysis.context["effective_compute"] = effective_compute(ds)
    return analysis


SERIES_SIGNALS = (("sm", "sm_active"), ("clk", "sm_clock"), ("power", "power_w"), ("temp", "gpu_temp"))
SERIES_FINDINGS = 12   # the written analysis charts the twelve largest findings (reports.analysis_pdf)
SERIES_POINTS = 150    # per signal: the mean of each of this many equal bins of the window


def finding_series(ds: Dataset, findings: list) -> dict[str, dict[str, list]]:  # list[Finding]
    """The timelines the written analysis draws for each of the largest findings: ``{finding id: {signal:
    [[epoch, value], ...]}}`` over the finding's span widened by its length (at least 10 minutes) on each side,
    the mean over the finding's devices (its device; its node's, job's or rack's) of each of SERIES_POINTS bins
    that hold samples (a bin without any is left out, never filled in). Signals: SM activity (fraction), SM
    clock (MHz), power (W), temperature (C), from the samples the agents read."""
    import numpy as np

    sm = ds.samples
    out: dict[str, dict[str, list]] = {}
    if sm is None or not len(sm):
        return out
    causes = sorted((f for f in findings if f.agent != "recommendation"), key=lambda f: (-f.gpu_hours, f.id))
    label = label_equals(sm)
    t_all = sm["t"].to_numpy(float)
    for f in causes[:SERIES_FINDINGS]:
        sc = f.scope_dict()
        keys = next((ks for ks in (("device_uuid",), ("job_id", "node"), ("job_id",), ("node",), ("rack",))
                     if all(sc.get(k) for k in ks)), None)
        cols = {"device_uuid": "device", "job_id": "job_id", "node": "node", "rack": "rack"}
        if keys is None or any(cols[k] not in sm for k in keys):
            continue
        m = np.logical_and.reduce([label(cols[k], sc[k]) for k in keys])
        pad = max(f.end - f.start, 600.0)
        a, b = f.start - pad, f.end + pad
        rows = np.flatnonzero(m & (t_all >= a) & (t_all <= b))   # the rows' positions, no copy of the frame
        if not len(rows):
            continue
        edges = np.linspace(a, b, SERIES_POINTS + 1)
        idx = np.clip(np.searchsorted(edges, t_all[rows], side="right") - 1, 0, SERIES_POINTS - 1)
        mids = (edges[:-1] + edges[1:]) / 2
        sig: dict[str, list] = {}
        for col, name in SERIES_SIGNALS:
            v = sm[col].to_numpy(float)[rows] if col in sm else np.zeros(0)
            ok = np.isfinite(v)
            if not ok.any():
                continue
            s_ = np.bincount(idx[ok], weights=v[ok], minlength=SERIES_POINTS)
            n = np.bincount(idx[ok], minlength=SERIES_POINTS)
            sig[name] = [[round(float(mids[i]), 1), round(float(s_[i] / n[i]), 4)] for i in range(SERIES_POINTS)
                         if n[i]]
        if sig:
            out[f.id] = sig
    return out


_KINDS = {"dcgmi_dmon": "dmon", "amd_smi": "amd-smi", "nvidia_smi": "nvidia-smi", "capture_set": "capture set"}


def _context(collected, res, analysis: Analysis, sources: list[str], digests: dict[str, str]) -> dict:  # noqa: ANN001
    src = []
    kind = _KINDS.get(collected.source, collected.source)
    for s in sources:
        entry = {"kind": kind, "name": Path(s).name}
        if s in digests:
            entry["sha256"] = digests[s]
        src.append(entry)
    covered = sum(d.get("covered_s", 0.0) for d in res.per_device.values())
    unknown = sum(d.get("unknown_s", 0.0) for d in res.per_device.values())
    gaps = [{"device": dev, **g} for dev, d in res.per_device.items() for g in d.get("gaps", [])]
    return {"title": "ipledger export analysis", "sources": src or [{"kind": kind,
                                                                      "name": str(collected.source)}],
            "import": {"devices": res.devices, "samples": res.samples, "unknown_intervals": res.unknown_intervals,
                       "missing": res.missing, "quarantined": list(collected.quarantined)},
            "devices": [{"uuid": dev, "node": d.get("node"), "samples": d.get("samples"),
                         "sku": getattr(collected.devices.get(dev), "sku", None),
                         "index": getattr(collected.devices.get(dev), "index", None),
                         "coverage": round(d["covered_s"] / max(d["covered_s"] + d["unknown_s"], 1e-9), 4)}
                        for dev, d in sorted(res.per_device.items())],
            "coverage": {"start": analysis.meta.get("start"), "end": analysis.meta.get("end"),
                         "fraction": round(covered / max(covered + unknown, 1e-9), 4), "gaps": gaps[:200]},
            "method": method_info(), "path": "B"}


def render_pdf(analysis: Analysis, out: Path) -> Path:
    """The analysis laid out as the written export analysis (reports.analysis_pdf)."""
    from reports import analysis_pdf

    return analysis_pdf.render(analysis.to_json(), out)
