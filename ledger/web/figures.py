"""The pages' figures that need the agents' dataset (fleet, rack, node, tenant and device pages), computed in a
short-lived child process per ledger head so that the server never holds the dataset.

`ask(url, questions, prefetch)` starts a fresh interpreter (multiprocessing's spawn), which reads the ledger, runs the agents
(the same `hourly.load_compact` and `agents.find` that `ipledger account`/`explain` run), answers the questions
with the same `ledger.agents.query` calls, and exits; the server keeps only the answers (plain dicts and SVG
text) keyed by question. ``prefetch`` also answers every question of the period `all` (the fleet, every rack,
node and tenant, every device), so that the links of a page are answered without another child.

A question is a tuple: ``("fleet", period_text)``, ``("scope", kind, name, period_text)`` (kind: rack, node,
tenant), ``("device", uuid)``. Its key (what an answer is stored under) names the period by its bounds, so two
spellings of one period share an answer: `key(question, bounds)`. Two kinds are their own key and are asked
alone (:data:`ALONE`), their child reading no agents' dataset: a month's statement, ``("statement", month,
tenant)`` (`ipledger export monthly`'s `build_statement`), and a receipt's file, ``("receipt", job, run, suffix)``
(`ipledger receipt`'s text, JSON, PDF or proof bundle: suffix "", ".json", ".pdf", ".bundle.json"); and
``("billed", month)``, the month's statement rows a question of that calendar month prices against, built in a
child of their own and handed pickled to the child that answers the question (:func:`month_rows`).

The server process imports none of pandas, pyarrow or DuckDB: they load in the children only."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from html import escape
from pathlib import Path

SCOPE_KINDS = ("rack", "node", "tenant")
ALONE = ("statement", "billed", "receipt")   # questions a child answers without the agents' dataset
# The samples' columns the figures read once the agents have run (ledger.agents.accounting and query, and the
# charts here); the raw telemetry only the agents' rules read (span_end, dt, sm, ecc, row remaps, fb, procs, act,
# ratio, resident, vendor, rated) is dropped then, so every copy a figure makes is that much smaller.
FIGURE_COLUMNS = ("device", "t", "ai", "h", "h_del", "h_thr", "h_under", "h_starved", "h_idle", "h_missing",
                  "rbucket", "clk", "power", "temp", "xid", "running", "cluster", "job_id", "run", "tenant",
                  "partition", "qos", "node", "rack", "sku")
CHILD_TIMEOUT_S = 600          # the demo takes seconds; a ledger this cannot read in ten minutes needs the CLI


@dataclass(frozen=True)
class Bounds:
    """The dataset's time span and currency, and the names a scope page may ask for (scope_masks's own sets)."""

    start: float
    end: float
    currency: str
    known: dict          # kind -> frozenset of names (rack, node, tenant), "device" -> device ids without GPU-


@dataclass(frozen=True)
class Answers:
    """What one child computed: the bounds (None from a statements-only child), answers by key, and the child's
    own peak memory and time."""

    bounds: Bounds | None
    by_key: dict
    peak_mib: float
    seconds: float


class FiguresError(RuntimeError):
    """The child failed: its last line of stderr."""


class NotAnswerable(Exception):
    """A question the pages answer with an HTTP error (bad period, unknown name): code and one-line message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def device_id(uuid: str) -> str:
    """A device's key: its uuid without NVIDIA's `GPU-` prefix (pages link either spelling)."""
    return uuid.removeprefix("GPU-")


def key(question: tuple, bounds: Bounds) -> tuple:
    """The key an answer to ``question`` is stored under; NotAnswerable for a bad period or an unknown name."""
    from ..agents.ask import BadPeriod, parse_period

    def period(text: str) -> tuple[float, float, str]:
        try:
            start, end, label = parse_period(text or "all", bounds.start, bounds.end)
        except BadPeriod as exc:
            raise NotAnswerable(400, str(exc)) from None
        if end <= bounds.start or start >= bounds.end:
            raise NotAnswerable(404, f"the ledger has no data in {label}")
        return start, end, label

    what = question[0]
    if what == "fleet":
        return ("fleet", *period(question[1]))
    if what == "scope":
        _, kind, name, text = question
        known = bounds.known.get(kind, frozenset())
        if name not in known:
            raise NotAnswerable(404, f"unknown {kind} {name!r} (known: {', '.join(sorted(known)[:12])})")
        start, end, _ = period(text)
        return ("scope", kind, name, start, end)
    if what == "device":
        d = device_id(question[1])
        if d not in bounds.known.get("device", frozenset()):
            raise NotAnswerable(404, f"no device {question[1]} in the ledger")
        return ("device", d)
    raise ValueError(f"not a question: {question!r}")


# --- the child: figures from the dataset -------------------------------------------------------------------


def bounds_of(ds) -> Bounds:  # noqa: ANN001 - a Dataset
    known = {"node": frozenset(ds.devices["node"].dropna()), "rack": frozenset(ds.devices["rack"].dropna()),
             "tenant": frozenset(ds.allocs["tenant"].dropna()),
             "device": frozenset(device_id(str(d)) for d in ds.samples["device"].unique())}
    return Bounds(float(ds.start), float(ds.end), str(ds.currency), known)


def month_rows(engine, start: float, end: float, billed: dict | None = None):  # noqa: ANN001, ANN201
    """`query.billed_rows` of [start, end): from ``billed`` (month -> those rows as a child of their own pickled
    them, the ("billed", month) question; None: nothing issued) where it holds the month, else read here."""
    import pickle

    from ..agents import query
    from ..base.periods import calendar_month

    month = calendar_month(start, end)
    if billed and month in billed:
        return pickle.loads(billed[month]) if billed[month] is not None else None  # noqa: S301 - our own child's
    return query.billed_rows(engine, start, end)


def fleet_figures(engine, ds, found, start: float, end: float, label: str,  # noqa: ANN001
                  billed: dict | None = None) -> dict:
    """`ipledger account --period P --json`'s figures (the same call), the per-node ranking and the heat map."""
    from ..agents import query

    res = query.period(ds, found, start, end, label, month_rows(engine, start, end, billed))
    nodes = sorted(query.ranking(ds, "node", "paid", start, end, n=10_000), key=lambda r: r["node"])
    return {"res": res, "nodes": nodes, "heat": heatmap_svg(ds.samples, start, end)}


def scope_figures(engine, ds, found, kind: str, name: str, start: float, end: float,  # noqa: ANN001
                  billed: dict | None = None) -> dict:
    """`ipledger explain --KIND NAME --period P --json`'s figures (the same call); for a rack or node also its
    devices and delivered share per hour."""
    from ..agents import query

    res = query.scope(ds, found, kind, name, start, end, month_rows(engine, start, end, billed))
    devices, chart = [], ""
    if kind in ("node", "rack"):
        sel = ds.samples[ds.samples[kind].astype(str) == name]
        devices, chart = sorted({str(d) for d in sel["device"].unique()}), hourly_svg(sel)
    return {"res": res, "devices": devices, "chart": chart}


def device_figures(sel, currency: str, gaps: list[dict] = ()) -> dict:  # noqa: ANN001 - one device's samples
    """A device's charts (delivered share, SM clock, power, temperature per hour on one hour axis, throttled
    hours shaded by reason, unknown telemetry marked: the recorded gaps of the device, its node or its cluster,
    and hours of its runs with a field missing), its nodes and GPU-hours. A chart is its parts (see
    `device_chart`): the server adds the marks of the device's findings, which it holds."""
    axis = hour_axis(sel)
    nodes = set(sel["node"].astype(str))
    dev = device_id(str(sel["device"].iloc[0])) if len(sel) else ""
    mine = [g for g in gaps if (device_id(str(g["device"])) == dev if g.get("device")
                                else (g.get("node") in nodes if g.get("node") else True))]
    shade = throttle_shading(sel, axis) + unknown_shading(sel, axis) + [
        ("gap", float(g["start"]) / 3600, float(g["end"]) / 3600, str(g.get("cause") or "gap")) for g in mine]
    charts = {"delivered share": {"height": 80, "shade": shade, "lines": hourly_lines(sel, axis, 80)}}
    for col, lab in (("clk", "SM clock (MHz)"), ("power", "power (W)"), ("temp", "temperature (degC)")):
        charts[lab] = {"height": 60, "shade": shade, "lines": column_lines(sel, col, axis, 60)}
    return {"charts": charts, "axis": axis, "nodes": sorted(nodes),
            "res": device_res(sel, currency)}


def answer(engine, ds, found, bounds: Bounds, question: tuple,  # noqa: ANN001
           billed: dict | None = None) -> tuple[tuple, object]:
    """(key, answer) of one question; NotAnswerable for one the pages refuse (the server says why)."""
    k = key(question, bounds)
    if k[0] == "fleet":
        return k, fleet_figures(engine, ds, found, *k[1:], billed=billed)
    if k[0] == "scope":
        return k, scope_figures(engine, ds, found, *k[1:], billed=billed)
    sel = ds.samples[ds.samples["device"].astype(str).map(device_id) == k[1]]
    return k, device_figures(sel, ds.currency, ds.gaps)


def prefetch(engine, ds, found, bounds: Bounds) -> dict:  # noqa: ANN001
    """Every answer of the period `all`: the fleet, each rack, node and tenant, each device (samples grouped once)."""
    by_key = {}
    k, a = answer(engine, ds, found, bounds, ("fleet", "all"))
    by_key[k] = a
    start, end = bounds.start, bounds.end
    s = ds.samples
    for kind in SCOPE_KINDS:   # one scope's samples at a time: all groups at once would copy the dataset
        for name in sorted(bounds.known[kind]):
            by_key[("scope", kind, name, start, end)] = scope_figures(engine, ds, found, kind, name, start, end)
    for d, sel in s.groupby(s["device"].astype(str).map(device_id), sort=False):
        by_key[("device", d)] = device_figures(sel, ds.currency, ds.gaps)
    return by_key


def statement_figures(engine, month: str, tenant: str | None) -> dict:  # noqa: ANN001
    """A month's statement as the page shows it (`ipledger export monthly`'s own `build_statement` and
    `to_json`): the JSON document, its totals, ledger head and billed amount as shown; ``{"error": line}`` when
    the export refuses the month."""
    import json

    from reports.export import ExportError, build_statement, to_json
    from reports.monthly import cents

    try:
        st = build_statement(engine, month, tenant=tenant)
    except ExportError as exc:
        return {"error": str(exc)}
    t = st.totals
    return {"json": json.loads(json.dumps(to_json(st), default=str)), "totals": json.loads(json.dumps(t, default=str)),
            "through_seq": st.through_seq, "head_hash": st.head_hash, "billed": cents(t["billed"]),
            "currency": ",".join(t["currencies"])}


def receipt_file(engine, job: str, run: int | None, suffix: str, sku_table) -> dict:  # noqa: ANN001
    """A receipt's file at the ledger's head, as `ipledger receipt JOB` gives it (the terms an issue would use):
    ``{"content": text or bytes}`` — its text (suffix ""), JSON (".json"), PDF (".pdf") or the proof bundle
    `ipledger receipt JOB --proof --out` writes (".bundle.json"); ``{"error": (code, line)}`` when refused."""
    import json
    import tempfile

    from ..receipts import ReceiptError, issue_receipt, render_pdf, render_text

    if suffix == ".bundle.json":
        return _bundle_file(engine, job, run, sku_table)
    try:
        r = issue_receipt(engine, job, run, sku_table=sku_table, dry_run=True).receipt
    except ReceiptError as exc:
        return {"error": (404, str(exc))}
    if suffix == ".json":
        return {"content": json.dumps(r.body, indent=2, sort_keys=True, ensure_ascii=False) + "\n"}
    if suffix == ".pdf":
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "receipt.pdf"
            render_pdf([r], p)
            return {"content": p.read_bytes()}
    return {"content": render_text(r)}


def _bundle_file(engine, job: str, run: int | None, sku_table) -> dict:  # noqa: ANN001
    import tempfile

    from ..chain.heads import HeadError, latest_head
    from ..chain.merkle import TreeError
    from ..proofcheck import Failure
    from ..receipts.bundle import build_bundle, write_bundle
    from ..receipts import ReceiptError

    with engine.connect() as conn:
        h = latest_head(conn)
    if h is None:
        return {"error": (404, "the ledger has no signed tree head yet (ipledger checkpoint makes one)")}
    try:
        b = build_bundle(engine, job, run, h, sku_table=sku_table)
    except ReceiptError as exc:
        return {"error": (404, str(exc))}
    except (HeadError, Failure, TreeError) as exc:
        return {"error": (500, f"the proof bundle cannot be made: {exc}")}
    with tempfile.TemporaryDirectory() as d:   # the bytes `ipledger receipt JOB --proof --out` writes
        p = Path(d) / "bundle.json"
        write_bundle(b, str(p))
        return {"content": p.read_bytes()}


def answer_alone(engine, question: tuple, sku_table) -> dict:  # noqa: ANN001
    """The answer to a statement, billed-rows or receipt question (:data:`ALONE`)."""
    if question[0] == "statement":
        return statement_figures(engine, question[1], question[2])
    if question[0] == "billed":   # a month's statement rows for a question child (`month_rows`), pickled
        import pickle

        from ..agents import query
        from ..base.periods import month_bounds

        a, b = month_bounds(question[1])
        rows = query.billed_rows(engine, a.timestamp(), b.timestamp())
        return {"rows": pickle.dumps(rows) if rows is not None else None}
    return receipt_file(engine, *question[1:], sku_table)


def compute(url: str, questions: list[tuple], with_prefetch: bool, sku_table=None,  # noqa: ANN001
            billed: dict | None = None) -> Answers:
    """Read the ledger at ``url`` (read-only), run the agents and answer: what the child does. Questions that
    need no dataset (:data:`ALONE`, without prefetch) read only what they need: the agents do not run. ``billed``:
months' statement rows already pickled by another child (:func:`month_rows`), so that this one, which holds the
dataset, never holds a statement's build as well."""
    from ..chain.db import make_engine

    t0 = time.monotonic()
    engine = make_engine(url, create=False, read_only=True)
    if not with_prefetch and questions and all(q[0] in ALONE for q in questions):
        by_key = {q: answer_alone(engine, q, sku_table) for q in questions}
        engine.dispose()
        return Answers(None, by_key, peak_mib(), time.monotonic() - t0)
    from .. import agents
    from ..agents import hourly

    ds = hourly.load_compact(engine, detail=True)
    found = agents.find(ds) if len(ds.allocs) else []
    ds.samples = ds.samples.drop(columns=[c for c in ds.samples.columns if c not in FIGURE_COLUMNS])   # no copy
    ds.hourly = None   # the agents' per device-hour statistics: read by their rules only
    release_freed_memory()   # the load's and the agents' temporaries: the figures below reuse the pages
    bounds = bounds_of(ds)
    by_key = prefetch(engine, ds, found, bounds) if with_prefetch else {}
    for q in questions:
        try:
            k, a = answer(engine, ds, found, bounds, q, billed)
        except NotAnswerable:
            continue
        by_key[k] = a
    engine.dispose()
    return Answers(bounds, by_key, peak_mib(), time.monotonic() - t0)


def peak_mib() -> float:
    """This process's peak resident memory: VmHWM (of this program's own image; getrusage's ru_maxrss would keep
    the parent's peak across fork and exec), else ru_maxrss."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def release_freed_memory() -> None:
    """Collect garbage, then return the allocator's freed pages to the system (:func:`ledger.base.heap.return_freed_heap`),
    so that the figures' temporaries reuse them instead of raising the child's peak (about 40 MiB on the demo)."""
    import gc

    from ..base.heap import return_freed_heap

    gc.collect()
    return_freed_heap()


def _child_settings() -> None:
    """The child's set-up, before it imports pyarrow: Arrow's own allocator keeps freed blocks, the system's gives
    them back (about 30 MiB less peak); glibc serves the columns from their own mappings, given back when freed
    (:func:`ledger.base.heap.free_large_blocks_at_once`)."""
    from ..base.heap import free_large_blocks_at_once

    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    free_large_blocks_at_once()


def ask(url: str, questions: list[tuple], with_prefetch: bool, sku_table=None,  # noqa: ANN001
        billed: dict | None = None) -> Answers:
    """`compute` in a short-lived child process (the server's memory never holds the dataset, nor imports what
    reads it; ``sku_table``: the site's, for receipts): a fresh interpreter
    started by multiprocessing's spawn (this process's import path, no fork of the server), ended after one answer.
    A child that raises, dies or runs past :data:`CHILD_TIMEOUT_S` is a :class:`FiguresError` naming why."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_child_settings)
    try:
        table = dict(sku_table) if sku_table is not None else None   # a plain dict crosses to the child
        return pool.submit(compute, url, questions, with_prefetch, table, billed).result(timeout=CHILD_TIMEOUT_S)
    except FutureTimeout:
        for child in multiprocessing.active_children():   # the pool's one process: end it now, not at its end
            child.terminate()
        raise FiguresError(f"the figures' child process did not finish in {CHILD_TIMEOUT_S} s") from None
    except BrokenProcessPool:
        raise FiguresError("the figures' child process died before it answered") from None
    except Exception as exc:  # noqa: BLE001 - the child's own error, named in one line
        lines = str(exc).strip().splitlines()
        raise FiguresError(f"the figures' child process failed: {type(exc).__name__}: "
                           f"{lines[-1] if lines else 'no message'}") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# --- charts (inline SVG) ---------------------------------------------------------------------------------------


CHART_WIDTH = 600
THROTTLE_FILL = {"thermal": "#f4a582", "power_cap": "#fddb87", "hw_slowdown": "#d6a5e0", "sync_boost": "#a6d9f0",
                 "other": "#d9d9d9"}


def _svg(width: int, height: int, body: str, cls: str = "chart") -> str:
    return (f'<svg class="{cls}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa" stroke="#ccc"/>{body}</svg>')


def _polylines(segs: list[list[str]], stroke: str, extra: str = "") -> str:
    return "".join(f'<polyline fill="none" stroke="{stroke}"{extra} points="{" ".join(p)}"/>' for p in segs)


def hour_axis(sel) -> tuple[int, int]:  # noqa: ANN001
    """The first and last hour (epoch hours) of the samples: the x axis of a chart."""
    hour = (sel["t"] // 3600).astype("int64")
    return (int(hour.min()), int(hour.max())) if len(hour) else (0, 0)


def _x(hour: float, axis: tuple[int, int], width: int = CHART_WIDTH) -> float:
    lo, hi = axis
    return (hour - lo) / max(hi - lo, 1) * (width - 10) + 5


def _band(h0: float, h1: float, axis: tuple[int, int], height: int, attrs: str, title: str) -> str:
    """A full-height rectangle over hours [h0, h1) (clipped to the axis): a shaded interval."""
    lo, hi = axis
    a, b = max(h0, lo), min(h1, hi + 1)
    if b <= a:
        return ""
    x0, x1 = _x(a, axis), _x(b, axis)
    return (f'<rect x="{x0:.1f}" y="0" width="{max(x1 - x0, 1.0):.1f}" height="{height}" {attrs}>'
            f'<title>{escape(title)}</title></rect>')


MIN_THROTTLE_SHARE = 0.05   # an hour is shaded when at least this share of its GPU-hours were throttled


def throttle_shading(sel, axis: tuple[int, int]) -> list[tuple]:  # noqa: ANN001
    """Hours with at least MIN_THROTTLE_SHARE of their GPU-hours throttled, each with its largest reason:
    ("throttle", hour, reason, share of the hour throttled)."""
    from ..method import THROTTLE_REASONS

    s = sel[sel["ai"] >= 0]
    hour = (s["t"] // 3600).astype("int64")
    total = s.groupby(hour)["h"].sum()
    thr = s[s["h_thr"] > 0]
    if not len(thr):
        return []
    g = thr.groupby([hour[thr.index], thr["rbucket"].astype("int64")])["h_thr"].sum()
    out = []
    for hr, per in g.groupby(level=0):
        share = float(per.sum()) / float(total.get(hr, 0.0) or 1.0)
        if share < MIN_THROTTLE_SHARE:
            continue
        top = int(per.idxmax()[1])
        out.append(("throttle", int(hr), THROTTLE_REASONS[top] if 0 <= top < len(THROTTLE_REASONS) else "other", share))
    return out


def unknown_shading(sel, axis: tuple[int, int]) -> list[tuple]:  # noqa: ANN001
    """Hours with unknown (missing) telemetry in a run: ("unknown", hour, share of the hour unknown)."""
    s = sel[sel["ai"] >= 0]
    g = s.groupby((s["t"] // 3600).astype("int64"))[["h", "h_missing"]].sum()
    return [("unknown", int(hr), float(r["h_missing"] / r["h"])) for hr, r in g.iterrows()
            if r["h"] > 0 and r["h_missing"] > 0]


def hourly_lines(samples, axis: tuple[int, int] | None, height: int, width: int = CHART_WIDTH) -> str:  # noqa: ANN001
    """Delivered share per hour as SVG polylines; hours with no telemetry are gaps (the line breaks)."""
    s = samples[samples["ai"] >= 0]
    if not len(s):
        return ""
    hour = (s["t"] // 3600).astype("int64")
    g = s.groupby(hour)[["h", "h_del", "h_missing"]].sum()
    axis = axis or (int(g.index.min()), int(g.index.max()))
    segs, cur = [], []
    for hr in range(axis[0], axis[1] + 1):
        row = g.loc[hr] if hr in g.index else None
        known = row is not None and float(row["h"] - row["h_missing"]) > 0
        if not known:
            if cur:
                segs.append(cur)
            cur = []
            continue
        share = float(row["h_del"]) / float(row["h"]) if float(row["h"]) else 0.0
        cur.append(f"{_x(hr, axis, width):.1f},{height - 5 - share * (height - 10):.1f}")
    if cur:
        segs.append(cur)
    return _polylines(segs, "#4a7", ' stroke-width="1.5"')


def hourly_svg(samples, width: int = CHART_WIDTH, height: int = 80) -> str:  # noqa: ANN001 - a samples frame
    """Delivered share per hour as an inline SVG chart; hours with no telemetry are gaps (the line breaks)."""
    if samples is None or not len(samples):
        return ""
    lines = hourly_lines(samples, None, height, width)
    return _svg(width, height, lines) if lines else ""


def column_lines(sel, col: str, axis: tuple[int, int], height: int, width: int = CHART_WIDTH) -> str:  # noqa: ANN001
    """One sample column per hour (mean) as SVG polylines, broken where the hour has no value (unknown)."""
    g = sel.groupby((sel["t"] // 3600).astype("int64"))[col].mean().dropna()
    if not len(g):
        return ""
    vmax = float(g.max()) or 1.0
    segs, cur = [], []
    for hr in range(axis[0], axis[1] + 1):
        if hr not in g.index:
            if cur:
                segs.append(cur)
            cur = []
            continue
        cur.append(f"{_x(hr, axis, width):.1f},{height - 5 - float(g.loc[hr]) / vmax * (height - 10):.1f}")
    if cur:
        segs.append(cur)
    return _polylines(segs, "#57a")


def device_chart(part: dict, axis: tuple[int, int], windows: list[tuple[float, float, str]]) -> str:
    """A device chart from its parts: throttled hours shaded by reason, unknown hours grey, the
    findings' evidence windows (epoch seconds start, end, label) outlined, then the lines."""
    h = part["height"]
    out = []
    for shade in part["shade"]:
        if shade[0] == "throttle":
            _, hr, reason, share = shade
            out.append(_band(hr, hr + 1, axis, h, f'class="throttle" data-reason="{reason}" '
                             f'fill="{THROTTLE_FILL.get(reason, "#d9d9d9")}"', f"throttled ({reason}): {share:.0%} of the hour"))
        elif shade[0] == "unknown":
            _, hr, share = shade
            out.append(_band(hr, hr + 1, axis, h, 'class="unknown" fill="#999" fill-opacity="0.35"',
                             f"unknown telemetry: {share:.0%} of the hour"))
        else:
            _, h0, h1, cause = shade
            out.append(_band(h0, h1, axis, h, 'class="unknown gap" fill="#999" fill-opacity="0.35"',
                             f"unknown telemetry (gap: {cause})"))
    for start, end, label in windows:
        out.append(_band(start / 3600, end / 3600, axis, h, 'class="finding-window" fill="none" stroke="#c33" '
                         'stroke-width="1.5" stroke-dasharray="4 2"', f"finding {label}"))
    return _svg(CHART_WIDTH, h, "".join(out) + part["lines"])


def heatmap_svg(samples, start: float, end: float, cell: int = 4, row: int = 12) -> str:  # noqa: ANN001
    """Delivered share by node x hour as an inline SVG heat map (green: delivered, red: lost); an hour a node
    ran nothing is blank, an hour with no telemetry grey."""
    s = samples[(samples["ai"] >= 0) & (samples["t"] >= start) & (samples["t"] < end)]
    if not len(s):
        return ""
    hour = ((s["t"] - start) // 3600).astype("int64")
    g = s.assign(hour=hour).groupby(["node", "hour"])[["h", "h_del", "h_missing"]].sum()
    nodes = sorted({str(n) for n in g.index.get_level_values(0)})
    hours = int(hour.max()) + 1
    out = [f'<svg class="chart heatmap" xmlns="http://www.w3.org/2000/svg" width="{50 + hours * cell}" '
           f'height="{len(nodes) * row + 4}" role="img">']
    for i, n in enumerate(nodes):
        out.append(f'<text x="0" y="{i * row + 10}" font-size="10">{escape(n)}</text>')
    for (n, hr), r in g.iterrows():
        i = nodes.index(str(n))
        h, known = float(r["h"]), float(r["h"] - r["h_missing"])
        if h <= 0:
            continue
        share = float(r["h_del"]) / h
        fill = "#bbb" if known <= 0 else f"rgb({int(200 * (1 - share)) + 30},{int(170 * share) + 40},70)"
        out.append(f'<rect x="{50 + int(hr) * cell}" y="{i * row + 1}" width="{cell}" height="{row - 2}" '
                   f'fill="{fill}"><title>{escape(str(n))} +{int(hr)} h: {share:.0%} delivered</title></rect>')
    out.append("</svg>")
    return "".join(out)


def device_res(sel, currency: str) -> dict:  # noqa: ANN001
    """A device's sealed device-hours in the ledger (its samples' sums), in the scope page's shape."""
    s = sel[sel["ai"] >= 0]
    paid, deliv = float(s["h"].sum()), float(s["h_del"].sum())
    return {"answer": f"device: {paid:,.2f} GPU-hours in runs, {deliv:,.2f} delivered (priced on its runs' receipts)",
            "account": {"paid": paid, "delivered": deliv, "cost": {"paid": 0.0, "delivered": 0.0, "lost": 0.0}},
            "table": {"lines": []}, "basis": "device_hours"}
