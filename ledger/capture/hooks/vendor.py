"""The vendor tools' control and inventory answers the hooks must read to act, and nothing else.

A hook must know which GPUs its allocation holds (the UUID and model Slurm's index names: ``nvidia-smi
--query-gpu``, ``amd-smi list``), which DCGM GPU ids to group and whether DCGM accepted the group and the job
(``dcgmi discovery -l``, ``group -c``, ``stats -e/-s``). What the tools *measure* (``dcgmi stats -v -j``,
``amd-smi metric``) the hooks record raw, as ``tool_output`` entries, and :mod:`ledger.capture.sources` parses at ship
time. Standard library only, and no ``re``/``json`` on the paths the hooks take (str methods; JSON through
:func:`ledger.chain.canonical.loads`); :mod:`ledger.capture.sources` imports these parsers from here rather than keep its
own. Records are :class:`ledger.base.frozen.Frozen`, not dataclasses.
"""

from __future__ import annotations

from ...chain.canonical import loads
from ...base.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the hooks' import path
    from typing import Any, Mapping


# -- DCGM: the group and job-statistics controls, and the discovery that names the GPUs ----------------


SENTINELS = {
    "N/A": "not_available",
    "Not Specified": "not_specified",
    "Not Supported": "not_supported",
    "Not Found": "not_found",
    "Insf. Permission": "insufficient_permission",
    "<<<NULL>>>": "null",
}


class DcgmError(Frozen):
    """What dcgmi said instead of a report, classified: not_found | no_data | connection | error."""

    __slots__ = ("cause", "message")
    cause: str
    message: str


class DcgmGpu(Frozen):
    __slots__ = ("gpu_id", "name", "pci_bus_id", "uuid", "missing")
    _defaults = {"missing": dict}
    gpu_id: int
    name: str | None
    pci_bus_id: str | None
    uuid: str | None
    missing: Mapping[str, str]


_ERROR_CAUSES = (
    ("was not found", "not_found"),
    ("No data is available", "no_data"),
    ("not found", "not_found"),
    ("connection", "connection"),
    ("connect to", "connection"),
    ("Host engine", "connection"),
)


def classify_error(text: str) -> DcgmError:
    msg = next((ln.strip() for ln in text.splitlines() if "rror" in ln), text.strip().splitlines()[0] if text.strip() else "")
    for needle, cause in _ERROR_CAUSES:
        if needle.lower() in text.lower():
            return DcgmError(cause, msg)
    return DcgmError("error", msg)


def strip_ends(text: str, opening: str, closing: str) -> str | None:
    """``text`` without ``opening``+whitespace in front and whitespace+``closing``+whitespace behind, or None."""
    if not text.startswith(opening):
        return None
    inner = text[len(opening):].rstrip()
    if not inner.endswith(closing):
        return None
    return inner[: len(inner) - len(closing)].strip()


def parse_discovery(text: str) -> list[DcgmGpu]:
    """``dcgmi discovery -l``: GPU id, name, PCI bus id, UUID (``<<<NULL>>>`` names are missing, not names)."""
    gpus: list[DcgmGpu] = []
    cur: dict | None = None
    for line in text.splitlines():
        if "NvSwitch" in line or "Switch ID" in line:
            break
        got = discovery_gpu_row(line)
        if got is not None:
            if cur:
                gpus.append(_gpu(cur))
            cur = {"gpu_id": got[0], "name": got[1]}
            continue
        got2 = discovery_detail_row(line)
        if got2 is not None and cur is not None:
            cur[got2[0]] = got2[1]
    if cur:
        gpus.append(_gpu(cur))
    return gpus


def discovery_gpu_row(line: str) -> tuple[int, str] | None:
    """``| 0 | Name: NVIDIA H100 |`` -> (0, name) (as ``\\|\\s*(\\d{1,9})\\s*\\|\\s*Name:\\s*(.*?)\\s*\\|\\s*$``)."""
    if not line.startswith("|"):
        return None
    rest = line[1:].lstrip()
    n = 0
    while n < len(rest) and rest[n].isdecimal():
        n += 1
    if not 0 < n <= 9:
        return None
    name = strip_ends(rest[n:].lstrip(), "|", "|")
    if name is None or not name.startswith("Name:"):
        return None
    return int(rest[:n]), name[5:].lstrip()


def discovery_detail_row(line: str) -> tuple[str, str] | None:
    """``|   | PCI Bus ID: ... |`` / ``Device UUID: ...`` -> ("pci_bus_id" | "uuid", value)
    (as ``\\|\\s*\\|\\s*(PCI Bus ID|Device UUID):\\s*(.*?)\\s*\\|\\s*$``)."""
    if not line.startswith("|"):
        return None
    inner = strip_ends(line[1:].lstrip(), "|", "|")
    if inner is None:
        return None
    for label, key in (("PCI Bus ID:", "pci_bus_id"), ("Device UUID:", "uuid")):
        if inner.startswith(label):
            return key, inner[len(label):].lstrip()
    return None


def _gpu(d: dict) -> DcgmGpu:
    missing = {}
    vals = {}
    for k in ("name", "pci_bus_id", "uuid"):
        v = d.get(k)
        if v is None or v in SENTINELS or v == "":
            missing[k] = SENTINELS.get(v or "", "absent")
            vals[k] = None
        else:
            vals[k] = v
    return DcgmGpu(gpu_id=d["gpu_id"], missing=missing, **vals)


def parse_group_create(text: str) -> int | None:
    """``Successfully created group "NAME" with a group ID of 23`` -> 23."""
    needle = "with a group ID of"
    at = text.find(needle)
    while at >= 0:  # the first occurrence followed by whitespace, 1-18 digits and a word boundary
        rest = text[at + len(needle):]
        digits = rest.lstrip()
        n = 0
        while n < len(digits) and digits[n].isdecimal():
            n += 1
        after = digits[n:n + 1]
        if len(digits) < len(rest) and 0 < n <= 18 and not (after.isalnum() or after == "_"):
            return int(digits[:n])
        at = text.find(needle, at + 1)
    return None


def outcome(r, expect: str) -> DcgmError | None:  # noqa: ANN001 - a ledger.base.commands.CommandResult
    """None when a dcgmi control command did what ``expect`` says it prints, else what went wrong."""
    if r.ok and expect in r.stdout:
        return None
    if r.timed_out:
        return DcgmError("timeout", r.stderr.strip()[:300])
    return classify_error(r.stdout + "\n" + r.stderr)


class Tool:
    """Runs one vendor program through the allowlist (ledger.base.commands, or the hook's bounded ``run``); every
    method returns values, never raises on tool failure."""

    program = ""

    def __init__(self, commands: Mapping[str, str], timeout: float = 5.0, run=None):
        from ...base import commands as _commands

        self._run = run or _commands.run
        self.commands = commands
        self.timeout = timeout

    def call(self, *args: str):  # noqa: ANN201 - a ledger.base.commands.CommandResult
        return self._run(self.program, list(args), commands=self.commands, timeout=self.timeout)


DISCOVERY_ARGS = ("discovery", "-l")


def discovery_answer(r) -> list[DcgmGpu] | DcgmError:  # noqa: ANN001 - a ledger.base.commands.CommandResult
    """What ``dcgmi discovery -l`` (:data:`DISCOVERY_ARGS`) answered: DCGM's GPUs, or what went wrong."""
    if not r.ok:
        return DcgmError("timeout" if r.timed_out else classify_error(r.stdout + r.stderr).cause,
                         (r.stdout + r.stderr).strip()[:300])
    return parse_discovery(r.stdout)


class DcgmiCli(Tool):
    program = "dcgmi"

    def create_group(self, name: str, gpu_ids: list[int]) -> int | DcgmError:
        r = self.call("group", "-c", name, "-a", ",".join(str(i) for i in gpu_ids))
        gid = parse_group_create(r.stdout) if r.ok else None
        if gid is None:
            return DcgmError("timeout" if r.timed_out else classify_error(r.stdout + r.stderr).cause,
                             (r.stdout + r.stderr).strip()[:300])
        return gid

    def start_job(self, group_id: int, job_key: str) -> DcgmError | None:
        err = outcome(self.call("stats", "-g", str(group_id), "-e"), "Successfully")
        if err is not None:
            return err
        return outcome(self.call("stats", "-g", str(group_id), "-s", job_key), "Successfully started")


# -- nvidia-smi: the inventory (index, minor number, UUID, name) ------------------------------------------


PLACEHOLDERS = {
    "[N/A]": "not_available", "N/A": "not_available", "[Not Supported]": "not_supported",
    "Not Supported": "not_supported", "[Unknown Error]": "unknown_error", "[Insufficient Permissions]":
    "insufficient_permission", "[GPU is lost]": "gpu_lost", "": "absent",
}


INVENTORY_FIELDS = ("index", "minor_number", "uuid", "name", "pci.bus_id")


class NvidiaGpu(Frozen):
    __slots__ = ("index", "uuid", "name", "minor_number", "pci_bus_id", "missing")
    _defaults = {"minor_number": None, "pci_bus_id": None, "missing": dict}
    index: int
    uuid: str | None
    name: str | None
    minor_number: int | None
    pci_bus_id: str | None
    missing: Mapping[str, str]


class CsvRows(Frozen):
    """``--query-gpu`` CSV: column names (units stripped), unit per column, rows of values (None = missing)."""

    __slots__ = ("columns", "units", "rows", "missing")
    columns: tuple[str, ...]
    units: Mapping[str, str]
    rows: tuple[Mapping[str, object], ...]
    missing: tuple[Mapping[str, str], ...]


def _split_header(cell: str) -> tuple[str, str | None]:
    import re

    m = re.match(r"\s*(.*?)\s*\[(.*?)\]\s*$", cell)
    return (m.group(1), m.group(2)) if m else (cell.strip(), None)


def is_integer_text(v: str) -> bool:
    """What ``re.fullmatch(r"-?\\d+", v)`` accepts: an optional minus, then one or more decimal digits."""
    return (v[1:] if v[:1] == "-" else v).isdecimal()


def _value(text: str, unit: str | None) -> tuple[object, str | None]:
    v = text.strip()
    if v in PLACEHOLDERS:
        return None, PLACEHOLDERS[v]
    if unit and v.endswith(" " + unit):  # values keep their unit unless "nounits" was given
        v = v[: -len(unit) - 1].strip()
    try:
        return (int(v) if is_integer_text(v) else float(v)), None
    except ValueError:
        return v, None


def parse_query_csv(text: str, columns: tuple[str, ...] | None = None) -> CsvRows:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``; pass ``columns`` when noheader.

    Lines before the header that are not CSV (a shell prompt such as ``$ kubectl exec ...``) are skipped.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    units: dict[str, str] = {}
    if columns is None:
        import re

        start = next((i for i, ln in enumerate(lines) if not ln.lstrip().startswith(("$", "#")) and "," in ln
                      and not re.match(r"^\s*\d", ln)), None)
        if start is None:
            raise ValueError("nvidia-smi CSV: no header line")
        names = []
        for cell in lines[start].split(","):
            name, unit = _split_header(cell)
            names.append(name)
            if unit:
                units[name] = unit
        columns = tuple(names)
        lines = lines[start + 1:]
    rows, missing = [], []
    for ln in lines:
        cells = [c.strip() for c in ln.split(", ")] if ", " in ln else [c.strip() for c in ln.split(",")]
        if len(cells) != len(columns):
            raise ValueError(f"nvidia-smi CSV: line {ln!r} has {len(cells)} fields, expected {len(columns)}")
        row: dict[str, object] = {}
        miss: dict[str, str] = {}
        for name, cell in zip(columns, cells):
            unit = units.get(name)
            if unit is None and cell.endswith((" %", " W", " MHz", " MiB", " C")):
                unit = cell.rsplit(" ", 1)[1]
            val, cause = _value(cell, unit)
            if cause:
                miss[name] = cause
            row[name] = val
        rows.append(row)
        missing.append(miss)
    return CsvRows(columns=tuple(columns), units=units, rows=tuple(rows), missing=tuple(missing))


def parse_inventory_csv(text: str) -> list[NvidiaGpu]:
    """Rows of ``--query-gpu=index,minor_number,uuid,name,pci.bus_id --format=csv,noheader,nounits``."""
    table = parse_query_csv(text, INVENTORY_FIELDS)
    gpus = []
    for n, (row, miss) in enumerate(zip(table.rows, table.missing), start=1):
        if not isinstance(row["index"], int):
            raise ValueError(f"nvidia-smi CSV: row {n}: index is not a number: {row['index']!r}")
        gpus.append(NvidiaGpu(index=row["index"],
                              minor_number=row["minor_number"] if isinstance(row["minor_number"], int) else None,
                              uuid=row["uuid"] if isinstance(row["uuid"], str) else None,
                              name=row["name"] if isinstance(row["name"], str) else None,
                              pci_bus_id=row["pci.bus_id"] if isinstance(row["pci.bus_id"], str) else None,
                              missing=dict(miss)))
    return gpus


INVENTORY_ARGS = ("--query-gpu=" + ",".join(INVENTORY_FIELDS), "--format=csv,noheader,nounits")


def inventory_answer(r) -> list[NvidiaGpu] | str:  # noqa: ANN001 - a ledger.base.commands.CommandResult
    """What the ``nvidia-smi`` inventory (:data:`INVENTORY_ARGS`) answered: the GPUs, or what went wrong."""
    if not r.ok:
        return ("timeout" if r.timed_out else "error") + ": " + (r.stderr or r.stdout).strip()[:200]
    try:
        return parse_inventory_csv(r.stdout)
    except ValueError as exc:
        return f"unparsed: {exc}"


# -- amd-smi: the inventory (index, UUID, market name) ---------------------------------------------------


NA = {"N/A", "n/a", "NA", "", None}


class AmdGpu(Frozen):
    __slots__ = ("index", "bdf", "uuid", "sku", "missing")
    _defaults = {"sku": None, "missing": dict}
    index: int
    bdf: str | None
    uuid: str | None
    sku: str | None
    missing: Mapping[str, str]


def unwrap(v: Any) -> Any:
    if isinstance(v, dict) and "value" in v and set(v) <= {"value", "unit"}:
        return v["value"]
    return v


def json_records(text: str, what: str) -> list[dict]:
    """The per-GPU objects of an ``amd-smi ... --json`` answer; ValueError (what the callers catch) on any other shape."""
    # skip what precedes the document (a "$ command" line, a banner): from its first "[" or "{", whichever comes
    # first, so the {"cpu_data": [], "core_data": [], "gpu_data": [...]} envelope is not cut at an inner list
    starts = [i for i in (text.find("["), text.find("{")) if i >= 0]
    try:
        data = loads(text[min(starts):] if starts else text)
    except RecursionError:
        raise ValueError(f"amd-smi {what} JSON: nested too deeply") from None
    if isinstance(data, dict):
        data = data.get("gpu_data") or [data]
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise ValueError(f"amd-smi {what} JSON: expected a list of per-GPU objects")
    return data


def gpu_index(item: dict, what: str) -> int:
    gpu = unwrap(item.get("gpu"))
    if isinstance(gpu, bool) or not isinstance(gpu, (int, str)) or not str(gpu).strip().isdecimal() \
            or len(str(gpu).strip()) > 9:
        raise ValueError(f"amd-smi {what} JSON: \"gpu\" is not a GPU index: {str(gpu)[:40]!r}")
    return int(gpu)


def parse_list_json(text: str) -> list[AmdGpu]:
    """``amd-smi list --json``: ``[{"gpu": 0, "bdf": "...", "uuid": "...", ...}]``."""
    gpus = []
    for item in json_records(text, "list"):
        miss = {}
        vals = {}
        for k in ("bdf", "uuid"):
            v = unwrap(item.get(k))
            if v is None or (isinstance(v, str) and v in NA):
                miss[k] = "not_available"
                vals[k] = None
            else:
                vals[k] = str(v)
        gpus.append(AmdGpu(index=gpu_index(item, "list"), missing=miss, **vals))
    return gpus


def parse_static_market_names(text: str) -> dict[int, str]:
    """``amd-smi static --asic --json``: GPU index -> ``asic.market_name`` (the SKU)."""
    out = {}
    for item in json_records(text, "static"):
        asic = item.get("asic")
        name = unwrap(asic.get("market_name")) if isinstance(asic, dict) else None
        if isinstance(name, (str, int, float)) and name not in NA:
            out[gpu_index(item, "static")] = str(name)
    return out


class AmdSmiCli(Tool):
    program = "amd-smi"

    def inventory(self) -> list[AmdGpu] | str:
        r = self.call("list", "--json")
        if not r.ok:
            return ("timeout" if r.timed_out else "error") + ": " + (r.stderr or r.stdout).strip()[:200]
        try:
            gpus = parse_list_json(r.stdout)
        except (ValueError, KeyError) as exc:
            return f"unparsed: {exc}"
        s = self.call("static", "--asic", "--json")
        names = {}
        if s.ok:
            try:
                names = parse_static_market_names(s.stdout)
            except (ValueError, KeyError):
                names = {}
        return [AmdGpu(g.index, g.bdf, g.uuid, names.get(g.index), g.missing) for g in gpus]


def amd_counter_args(gpus: list[int]) -> list[str]:
    """``amd-smi`` arguments for the accumulating counters of these GPUs (read raw by the hooks, parsed at ship
    time by :func:`ledger.capture.sources.amd_snapshots.parse_metric_json`)."""
    args = ["metric"]
    for g in gpus:
        args += ["-g", str(g)]
    return args + ["--energy", "--ecc", "--throttle", "--json"]
