"""NVIDIA device inventory and snapshots: ``nvidia-smi`` CSV / ``-L`` / ``-q`` parsers and an NVML reader.

The hooks map Slurm's GPU indices to UUIDs and SKUs with ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``
(standard library only). ``nvidia-ml-py`` (``pynvml``) is used by :func:`nvml_inventory` when importable (the
collector; never on the hook path). Placeholders (``[N/A]``, ``N/A``, ``[Not Supported]``) become missing
fields with their cause, never zeros.
"""

from __future__ import annotations

from ..frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing stays off the hooks' import path
    from typing import Mapping

# The hooks call parse_inventory_csv (headerless CSV) on their fast path: it needs no ``re`` (≈ 6 ms to import
# under -I -S, with enum); the parsers that do need it import it when called. Records are Frozen, not dataclasses.

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


def parse_list(text: str) -> list[NvidiaGpu]:
    """``nvidia-smi -L``: ``GPU 0: NAME (UUID: GPU-...)``; indented MIG rows belong to the GPU above (skipped)."""
    import re

    gpus = []
    for ln in text.splitlines():
        m = re.match(r"GPU (\d+): (.*) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$", ln)
        if m:
            gpus.append(NvidiaGpu(index=int(m.group(1)), name=m.group(2).strip(), uuid=m.group(3)))
    return gpus


class MigDevice(Frozen):
    """A MIG device under its parent GPU, as ``nvidia-smi -L`` lists it or NVML enumerates it. ``gpu_instance``
    (the GI id that keys the device ``<parent UUID>/gi<id>``, as dcgm-exporter's ``GPU_I_ID``) is known from
    NVML only; ``-L`` prints a per-parent device number instead."""

    __slots__ = ("parent_uuid", "parent_index", "profile", "device", "uuid", "gpu_instance")
    _defaults = {"gpu_instance": None}
    parent_uuid: str
    parent_index: int
    profile: str | None
    device: int
    uuid: str | None
    gpu_instance: int | None


def parse_mig_list(text: str) -> list[MigDevice]:
    """``nvidia-smi -L``'s indented ``MIG 2g.20gb Device 0: (UUID: MIG-...)`` rows, each with its parent GPU."""
    import re

    out, parent = [], None
    for ln in text.splitlines():
        m = re.match(r"GPU (\d+): .* \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$", ln)
        if m:
            parent = (m.group(2), int(m.group(1)))
            continue
        m = re.match(r"\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[0-9a-fA-F-]+)\)\s*$", ln)
        if m and parent is not None:
            out.append(MigDevice(parent_uuid=parent[0], parent_index=parent[1], profile=m.group(1),
                                 device=int(m.group(2)), uuid=m.group(3)))
    return out


def parse_clock_event_reasons(text: str) -> list[dict]:
    """``nvidia-smi -q -d PERFORMANCE``: per GPU, each clock throttle/event reason -> active (bool) or None (N/A)."""
    import re

    gpus: list[dict] = []
    cur: dict | None = None
    in_block = False
    for ln in text.splitlines():
        m = re.match(r"GPU ([0-9A-Fa-f:.]+)\s*$", ln)
        if m:
            cur = {"pci_bus_id": m.group(1), "reasons": {}, "missing": {}}
            gpus.append(cur)
            in_block = False
            continue
        if cur is None:
            continue
        s = ln.strip()
        if re.match(r"Clocks (Throttle|Event) Reasons\s*(:.*)?$", s):
            if ":" in s and s.split(":", 1)[1].strip() in PLACEHOLDERS:
                cur["missing"]["clock_event_reasons"] = PLACEHOLDERS[s.split(":", 1)[1].strip()]
                in_block = False
            else:
                in_block = True
            continue
        if in_block and ":" in s:
            k, v = (x.strip() for x in s.split(":", 1))
            if v in ("Active", "Not Active"):
                cur["reasons"][k] = v == "Active"
            elif v in PLACEHOLDERS:
                cur["missing"][k] = PLACEHOLDERS[v]
            else:
                in_block = False
        elif in_block and s and ":" not in s:
            in_block = False
    return gpus


class NvidiaSmiCli:
    """Runs ``nvidia-smi`` through the allowlist."""

    def __init__(self, commands: Mapping[str, str], timeout: float = 5.0, run=None):
        from .. import commands as _commands

        self._run = run or _commands.run
        self.commands = commands
        self.timeout = timeout

    def inventory(self) -> list[NvidiaGpu] | str:
        r = self._run("nvidia-smi", ["--query-gpu=" + ",".join(INVENTORY_FIELDS), "--format=csv,noheader,nounits"],
                      commands=self.commands, timeout=self.timeout)
        if not r.ok:
            return ("timeout" if r.timed_out else "error") + ": " + (r.stderr or r.stdout).strip()[:200]
        try:
            return parse_inventory_csv(r.stdout)
        except ValueError as exc:
            return f"unparsed: {exc}"


def nvml_inventory() -> list[NvidiaGpu]:
    """The same inventory through NVML (``nvidia-ml-py``); raises ImportError when it is not installed."""
    import pynvml  # noqa: PLC0415 - optional, never on the hook path

    pynvml.nvmlInit()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            miss: dict[str, str] = {}

            def get(fn, key, _h=h, _miss=miss):
                try:
                    v = fn(_h)
                    return v.decode() if isinstance(v, bytes) else v
                except pynvml.NVMLError as exc:  # e.g. NVML_ERROR_NOT_SUPPORTED
                    _miss[key] = str(exc)
                    return None

            pci = get(pynvml.nvmlDeviceGetPciInfo, "pci.bus_id")
            bus = getattr(pci, "busId", None) if pci is not None else None
            gpus.append(NvidiaGpu(index=i, uuid=get(pynvml.nvmlDeviceGetUUID, "uuid"),
                                  name=get(pynvml.nvmlDeviceGetName, "name"),
                                  minor_number=get(pynvml.nvmlDeviceGetMinorNumber, "minor_number"),
                                  pci_bus_id=bus.decode() if isinstance(bus, bytes) else bus, missing=miss))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def nvml_mig_devices(nvml) -> list[MigDevice]:  # noqa: ANN001 - the pynvml module, passed in (tests pass a stand-in)
    """The MIG devices of every GPU in MIG mode, through NVML: GPU instance id, UUID and the profile, named
    ``<slices>g.<GiB rounded up>gb`` from the instance's ``gpuInstanceSliceCount`` and ``memorySizeMB`` (nvmlDeviceGetAttributes).
    A value NVML refuses is None (the instance is still listed); GPUs not in MIG mode contribute nothing."""
    nvml.nvmlInit()
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(h)
            except nvml.NVMLError:   # not MIG-capable
                continue
            if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
                continue
            parent = _text(nvml.nvmlDeviceGetUUID(h))
            for k in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except nvml.NVMLError:   # an empty slot
                    continue
                out.append(MigDevice(parent_uuid=parent, parent_index=i, profile=_mig_profile(nvml, m), device=k,
                                     uuid=_nvml_or_none(nvml, nvml.nvmlDeviceGetUUID, m),
                                     gpu_instance=_nvml_or_none(nvml, nvml.nvmlDeviceGetGpuInstanceId, m)))
        return out
    finally:
        nvml.nvmlShutdown()


def _text(v):  # noqa: ANN001, ANN202
    return v.decode() if isinstance(v, bytes) else v


def _nvml_or_none(nvml, fn, handle):  # noqa: ANN001, ANN202
    try:
        return _text(fn(handle))
    except nvml.NVMLError:
        return None


def _mig_profile(nvml, handle) -> str | None:  # noqa: ANN001
    attrs = _nvml_or_none(nvml, nvml.nvmlDeviceGetAttributes, handle)
    slices = getattr(attrs, "gpuInstanceSliceCount", None)
    mb = getattr(attrs, "memorySizeMB", None)
    if not slices or not mb:
        return None
    return f"{slices}g.{-(-int(mb) // 1024)}gb"   # GiB rounded up, as NVIDIA names profiles (40192 MiB: 3g.40gb)
