"""DCGM job statistics: the parser of ``dcgmi stats -v -j`` reports.

The hooks use DCGM's job statistics (``dcgmi group -c`` + ``dcgmi stats -e/-s`` in the prolog, ``stats -x`` and
``stats -v -j`` in the epilog, recorded raw and read here at ship time). The report is a fixed-width table (80 columns, values cut to 39 characters with
``...``); blank values are printed as sentinels (``N/A``, ``Not Specified``, ``Not Supported``, ``Not Found``,
``Insf. Permission``). The parser never turns a sentinel or a cut value into a number: it records the field as
missing with its cause. Times are ``ctime()`` in the host engine's local time.
"""

from __future__ import annotations

import time

from ...base.frozen import Frozen
# The control and discovery parsers the hooks need to act live with them; named here too for the importers.
from ..hooks.vendor import (  # noqa: F401
    SENTINELS, DcgmError, DcgmGpu, DcgmiCli, classify_error, discovery_detail_row, discovery_gpu_row, outcome,
    parse_discovery, parse_group_create, strip_ends
)

from typing import Mapping


# Report row label -> (field name, kind). kind: "int", "float", "stat" (Avg/Max/Min), "time", "text".
_ROWS = {
    "Start Time": ("start_time", "time"),
    "End Time": ("end_time", "time"),
    "Total Execution Time (sec)": ("execution_time_s", "float"),
    "No. of Processes": ("processes", "int"),
    "Energy Consumed (Joules)": ("energy_j", "int"),
    "Power Usage (Watts)": ("power_w", "stat"),
    "Max GPU Memory Used (bytes)": ("max_memory_bytes", "int"),
    "SM Clock (MHz)": ("sm_clock_mhz", "stat"),
    "Memory Clock (MHz)": ("memory_clock_mhz", "stat"),
    "SM Utilization (%)": ("sm_util_pct", "stat"),
    "Memory Utilization (%)": ("memory_util_pct", "stat"),
    "PCIe Rx Bandwidth (megabytes)": ("pcie_rx_mb", "stat"),
    "PCIe Tx Bandwidth (megabytes)": ("pcie_tx_mb", "stat"),
    "Single Bit ECC Errors": ("ecc_sbe", "int"),
    "Double Bit ECC Errors": ("ecc_dbe", "int"),
    "PCIe Replay Warnings": ("pcie_replays", "int"),
    "Critical XID Errors": ("xid_errors", "int"),
    "Due to - Power (%)": ("slowdown_power_pct", "float"),
    "- Thermal (%)": ("slowdown_thermal_pct", "float"),
    "- Reliability (%)": ("slowdown_reliability_pct", "float"),
    "- Board Limit (%)": ("slowdown_board_limit_pct", "float"),
    "- Low Utilization (%)": ("slowdown_low_util_pct", "float"),
    "- Sync Boost (%)": ("slowdown_sync_boost_pct", "float"),
    "Overall Health": ("health", "text"),
}

# Fields that are measurements of the device over the job: a block where all of them are missing measured nothing
# (the MIG case, NVIDIA/DCGM#93: power N/A, energy Not Specified, and zeros that are not measurements).
MEASUREMENT_FIELDS = ("energy_j", "power_w_avg", "sm_clock_mhz_avg", "sm_util_pct_avg", "memory_util_pct_avg")


class DcgmParseError(ValueError):
    """Output that is not a dcgmi report at all (one line, naming the line)."""


class GpuJobStats(Frozen):
    """One block of a ``dcgmi stats -j`` report: a GPU (``gpu_id``) or the job summary (``gpu_id`` None).

    ``start``/``end``: epoch seconds (local ctime parsed in the local zone) or None; ``values``: field ->
    number or text; ``missing``: field -> cause (not_supported, truncated, ...); ``processes``: per PID.
    """

    __slots__ = ("gpu_id", "start", "end", "values", "missing", "processes")
    _defaults = {"processes": ()}
    gpu_id: int | None
    start: float | None
    end: float | None
    values: Mapping[str, object]
    missing: Mapping[str, str]
    processes: tuple[Mapping[str, object], ...]

    @property
    def measured_nothing(self) -> bool:
        return all(f not in self.values for f in MEASUREMENT_FIELDS)


class JobStatsReport(Frozen):
    __slots__ = ("job_id", "blocks", "verbose")
    job_id: str
    blocks: tuple[GpuJobStats, ...]
    verbose: bool


_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                        "Nov", "Dec"), 1)}
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_ASCII_DIGITS = frozenset("0123456789")


def parse_ctime(text: str) -> float:
    """``Fri Dec 10 19:40:36 2021`` (local time, day padded with a space) -> epoch seconds.

    The shape dcgmi prints is read directly; anything else goes to ``time.strptime``, which is the reference
    (it imports ``_strptime`` -> re, locale, calendar, datetime: ≈ 15 ms the epilog should not pay).
    """
    norm = " ".join(text.split())
    parts = norm.split(" ")
    if len(parts) == 5 and parts[0] in _WEEKDAYS and parts[1] in _MONTHS:
        day, clock, year = parts[2], parts[3].split(":"), parts[4]
        fields = [day, *clock, year]
        if (len(clock) == 3 and len(year) == 4 and all(0 < len(f) <= 4 and set(f) <= _ASCII_DIGITS for f in fields)
                and all(len(f) <= 2 for f in fields[:4])):
            d, hh, mm, ss, y = (int(f) for f in fields)
            mon = _MONTHS[parts[1]]
            leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
            if 1 <= d <= (_MONTH_DAYS[mon - 1] if mon != 2 or leap else 28) and hh < 24 and mm < 60 and ss < 60:
                return time.mktime((y, mon, d, hh, mm, ss, 0, 1, -1))
    return time.mktime(time.strptime(norm, "%a %b %d %H:%M:%S %Y"))


def _number(text: str, kind: str) -> float | int:
    return int(text) if kind == "int" else float(text)


def _parse_stat(name: str, value: str, values: dict, missing: dict) -> None:
    # "Avg: 37.8985, Max: 45.874, Min: 22.999"; a part may be N/A or cut short ("Min: 247...").
    parts = {}
    for part in value.split(","):
        if ":" in part:
            k, v = part.split(":", 1)
            parts[k.strip().lower()] = v.strip()
    if not parts:
        cause = SENTINELS.get(value.strip(), "unparsed")
        for k in ("avg", "max", "min"):
            missing[f"{name}_{k}"] = "truncated" if value.endswith("...") else cause
        return
    for k in ("avg", "max", "min"):
        v = parts.get(k)
        key = f"{name}_{k}"
        if v is None:
            missing[key] = "truncated" if value.endswith("...") else "absent"
        elif v.endswith("..."):
            missing[key] = "truncated"
        elif v in SENTINELS:
            missing[key] = SENTINELS[v]
        else:
            try:
                values[key] = float(v)
            except ValueError:
                missing[key] = "unparsed"


def _rows(lines: list[str]):
    for line in lines:
        if not line.startswith("|") or line.startswith("|-") or line.startswith("+"):
            continue
        cells = line.strip().strip("|").split("|")
        if len(cells) != 2:
            continue
        yield cells[0].strip(), cells[1].strip(), line


def _parse_block(gpu_id: int | None, lines: list[str]) -> GpuJobStats:
    values: dict[str, object] = {}
    missing: dict[str, str] = {}
    processes: list[dict] = []
    start = end = None
    in_procs = False
    for label, value, raw in _rows(lines):
        if label == "PID":
            in_procs = True
            processes.append({"pid": int(value) if value.isdecimal() and len(value) <= 18 else value})
            continue
        if in_procs and label.startswith("Avg "):
            key = "sm_util_pct" if "SM" in label else "memory_util_pct"
            processes[-1][key] = _plain_float(value)
            continue
        if label.startswith("XID"):
            values.setdefault("xids", []).append(value)  # type: ignore[union-attr]
            continue
        spec = _ROWS.get(label)
        if spec is None:
            continue  # per-incident health rows, "Clocks and PCIe Performance", ...
        in_procs = False
        name, kind = spec
        if kind == "stat":
            _parse_stat(name, value, values, missing)
            continue
        if value.endswith("..."):
            missing[name] = "truncated"
            continue
        if value in SENTINELS:
            missing[name] = SENTINELS[value]
            continue
        if kind == "time":
            if value in ("Has Not Started", "Still Running", "Has not started"):
                missing[name] = "still_running" if "Running" in value else "not_started"
                continue
            try:
                t = parse_ctime(value)
            except ValueError:
                missing[name] = "unparsed"
                continue
            if name == "start_time":
                start = t
            else:
                end = t
            continue
        if kind == "text":
            values[name] = value
            continue
        try:
            values[name] = _number(value, kind)
        except ValueError:
            missing[name] = "unparsed"
    return GpuJobStats(gpu_id=gpu_id, start=start, end=end, values=values, missing=missing,
                       processes=tuple(processes))


def _plain_float(value: str) -> float | None:
    """A value of digits and dots only (what ``[\\d.]+`` matches), as a float; None otherwise (``1.2.3`` too)."""
    if value and all(c == "." or c.isdecimal() for c in value):
        try:
            return float(value)
        except ValueError:
            return None
    return None


_RETRIEVED = "Successfully retrieved statistics for job:"


def stats_job_id(line: str) -> str | None:
    """The job of ``Successfully retrieved statistics for job: ID.`` (as ``\\s*PREFIX\\s*(.*?)\\.\\s*$`` reads it)."""
    s = line.lstrip()
    if not s.startswith(_RETRIEVED):
        return None
    rest = s[len(_RETRIEVED):].strip()
    return rest[:-1] if rest.endswith(".") else None


def block_header(line: str) -> tuple[int | None] | None:
    """``| GPU ID: 0 |`` -> (0,), ``| Summary |`` -> (None,), anything else None
    (as ``\\|\\s*(GPU ID:\\s*\\d{1,9}|Summary)\\s*\\|\\s*$`` matches)."""
    inner = strip_ends(line, "|", "|")
    if inner is None:
        return None
    if inner == "Summary":
        return (None,)
    if inner.startswith("GPU ID:"):
        digits = inner[7:].lstrip()
        if 0 < len(digits) <= 9 and digits.isdecimal():
            return (int(digits),)
    return None


def parse_stats(text: str) -> JobStatsReport | DcgmError:
    """Parse ``dcgmi stats [-v] -j ID`` output (prompt lines and ``-x``/``group -d`` chatter around it allowed).

    One report: a text holding reports of several jobs is refused (:func:`parse_stats_reports` splits it), and a
    table without its "Successfully retrieved statistics for job: ID." line is refused as such (its job is
    unknown), never classified as a dcgmi error whose message is one of its rows.
    """
    reports = parse_stats_reports(text)
    if isinstance(reports, DcgmError):
        return reports
    if len(reports) > 1:
        raise DcgmParseError(f"dcgmi stats output holds {len(reports)} job reports "
                             f"({', '.join(r.job_id for r in reports)}): split them (parse_stats_reports)")
    return reports[0]


def parse_stats_reports(text: str) -> list[JobStatsReport] | DcgmError:
    """Every job report in ``text`` (a file several ``dcgmi stats -v -j`` runs were appended to), split at each
    "Successfully retrieved statistics for job: ID." line, in file order."""
    lines = text.splitlines()
    starts = [(i, job) for i, ln in enumerate(lines) if (job := stats_job_id(ln)) is not None]
    if not starts:
        if any(block_header(ln) is not None for ln in lines) or any(_row_label(ln) in _ROWS for ln in lines):
            raise DcgmParseError("a dcgmi stats table without its 'Successfully retrieved statistics for job: ID.' "
                                 "line: the job it belongs to is unknown")
        return classify_error(text)
    out = []
    for k, (i, job_id) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        out.append(_parse_report(job_id, lines[i + 1:end]))
    return out


def _row_label(line: str) -> str | None:
    """The label cell of a ``| label | value |`` row, stripped; None for anything else."""
    if not line.startswith("|") or line.count("|") < 3:
        return None
    return line.split("|")[1].strip()


def _parse_report(job_id: str, lines: list[str]) -> JobStatsReport:
    blocks: list[GpuJobStats] = []
    header: tuple[int | None] | None = None
    body: list[str] = []
    for ln in lines:
        got = block_header(ln)
        if got is not None:
            if header is not None:
                blocks.append(_parse_block(header[0], body))
            header, body = got, []
            continue
        if header is not None:
            body.append(ln)
    if header is not None:
        blocks.append(_parse_block(header[0], body))
    if not blocks:
        raise DcgmParseError(f"dcgmi stats report for job {job_id}: no GPU or Summary block")
    verbose = any(b.gpu_id is not None for b in blocks)
    return JobStatsReport(job_id=job_id, blocks=tuple(blocks), verbose=verbose)


def summary_fields(block: GpuJobStats) -> dict:
    """The payload of a ``telemetry_summary`` for one block: measured values and, separately, what is missing."""
    return {"values": dict(block.values), "missing": dict(block.missing),
            "processes": [dict(p) for p in block.processes]}




def stats_result(r) -> JobStatsReport | DcgmError:  # noqa: ANN001 - a ledger.base.commands.CommandResult
    """What ``dcgmi stats -v -j KEY`` answered: its report, or what went wrong (never raises)."""
    if r.timed_out:
        return DcgmError("timeout", r.stderr.strip()[:300])
    try:
        return parse_stats(r.stdout if r.ok else r.stdout + "\n" + r.stderr)
    except DcgmParseError as exc:
        return DcgmError("unparsed", str(exc))
