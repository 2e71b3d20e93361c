"""``nvidia-smi --query-gpu=... --format=csv`` loops and ``nvidia-smi -q -x`` (XML) snapshots or loops.

CSV: the header names the query fields with units in brackets (``utilization.gpu [%]``); values keep their
units unless ``nounits`` was given; ``[N/A]``/``[Not Supported]`` are not measurements. A ``timestamp``
column (``YYYY/MM/DD HH:MM:SS.mmm``, read as UTC: run the loop with ``TZ=UTC``) gives the time; without it
``start`` and ``interval`` are required and a tick ends when a GPU repeats. Repeated header lines (several
loops appended) are skipped. XML: one ``<nvidia_smi_log>`` document per snapshot, its ``<timestamp>`` the time
(else ``start``); each field is read from the first readable of the elements driver generations have used
(:data:`_XML_FIELDS`); ``Yes``/``No`` are 1/0; MIG instances (``<mig_devices>``) are devices of their own and their
parent is marked partitioned.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from ..telemetry.timeline import BadValue, clean
from ..base.textsafe import excerpt
from .common import Collected, CsvReader, DeviceInfo, InputError, decode_text, read_lines, small_index

# query name -> (Sample field, scale)
QUERY_FIELDS = {
    "utilization.gpu": ("gpu_util", 0.01), "utilization.memory": ("mem_copy_util", 0.01),
    "power.draw": ("power_w", 1.0), "power.draw.instant": ("power_w", 1.0), "power.draw.average": ("power_w", 1.0),
    "temperature.gpu": ("gpu_temp_c", 1.0), "temperature.memory": ("mem_temp_c", 1.0),
    "clocks.sm": ("sm_clock_mhz", 1.0), "clocks.current.sm": ("sm_clock_mhz", 1.0),
    "clocks.mem": ("mem_clock_mhz", 1.0), "clocks.current.memory": ("mem_clock_mhz", 1.0),
    "memory.used": ("fb_used_mib", 1.0),
    "clocks_event_reasons.active": ("clock_reasons", 1.0), "clocks_throttle_reasons.active": ("clock_reasons", 1.0),
    "ecc.errors.corrected.volatile.total": ("ecc_sbe_volatile", 1.0),
    "ecc.errors.uncorrected.volatile.total": ("ecc_dbe_volatile", 1.0),
    "ecc.errors.corrected.aggregate.total": ("ecc_sbe_aggregate", 1.0),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_dbe_aggregate", 1.0),
    "total_energy_consumption": ("energy_j", 0.001),
}
_NAME = re.compile(r"^[a-z][a-z0-9_.]*$")


def _is_header(names: list[str]) -> bool:
    return bool(names) and all(_NAME.match(x) for x in names) and \
        any("." in x or x in ("timestamp", "index", "uuid", "name") for x in names)


_UNIT_TAIL = re.compile(r"^\s*(\S+)\s*(%|W|MHz|MiB|C|mJ|J)?\s*$")


def _ts(s: str) -> float:
    s = s.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S", "%a %b %d %H:%M:%S %Y"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _value(s: str) -> str:
    """'290.28 W' -> '290.28'; '0x0000000000000004' -> '4'; '[N/A]' stays for clean() to explain."""
    s = s.strip()
    if s.lower().startswith("0x"):
        try:
            return str(int(s, 16))
        except ValueError:
            return s
    m = _UNIT_TAIL.match(s)
    return m.group(1) if m and not s.startswith("[") else s


def _columns_by_field(header: list[str]) -> list[tuple[str, list[str]]]:
    """Each Sample field the header carries, with its columns in :data:`QUERY_FIELDS`' order (best first)."""
    out: dict[str, list[str]] = {}
    for name, (field, _) in QUERY_FIELDS.items():
        if name in header:
            out.setdefault(field, []).append(name)
    return list(out.items())


def _readable(raw: str, field: str) -> bool:
    try:
        return clean(raw, field)[0] is not None
    except BadValue:
        return False


def parse_csv(text: str | Iterable[str], path: str = "<input>", *, start: float | None = None,
              interval: float | None = None, node: str | None = None) -> Collected:
    """``--format=csv`` output: the text, or its lines as :func:`common.read_lines` yields them (a long capture
    is then never held whole; the same rows, lines split as ``str.splitlines`` splits them)."""
    node = node or "unknown-node"
    c = Collected("nvidia_smi_csv", path=path, cadence=interval)
    pieces = text.splitlines() if isinstance(text, str) else (p for ln in text for p in ln.splitlines())
    lines = (ln + "\n" for ln in pieces if ln.strip() and not ln.lstrip().startswith(("$", "#")))
    header: list[str] | None = None
    tick, seen = -1, set()
    for n, row in enumerate(CsvReader(lines, path, skipinitialspace=True), start=1):
        names = [h.split(" [")[0].strip() for h in row]
        if _is_header(names):
            header = names
            continue
        if header is None:
            raise InputError(path, f"line {n}", "no header line (run nvidia-smi without 'noheader')")
        if len(row) != len(header):
            raise InputError(path, f"line {n}", f"{len(row)} columns, header has {len(header)}")
        rec = dict(zip(header, row))
        idx = rec.get("index")
        uuid = rec.get("uuid")
        if "timestamp" in rec:
            try:
                t = _ts(rec["timestamp"])
            except ValueError:
                raise InputError(path, f"line {n}", f"timestamp: not a time: '{excerpt(rec['timestamp'])}'") from None
        else:
            if start is None or interval is None:
                raise InputError(path, "", "no timestamp column: give --start and --interval "
                                           "(or add timestamp to --query-gpu)")
            ent = uuid or idx or rec.get("pci.bus_id") or "0"
            if ent in seen or tick < 0:
                tick, seen = tick + 1, set()
            seen.add(ent)
            t = start + tick * interval
        bus = rec.get("pci.bus_id")
        # without uuid or index, the PCI bus id still tells GPUs apart (a loop of name,pci.bus_id,... only)
        key = uuid or (f"{node}/gpu{idx}" if idx is not None else (f"{node}/{bus}" if bus else f"{node}/gpu0"))
        dev = c.device(DeviceInfo(device=key, node=node, index=small_index(idx) if idx else None,
                                  uuid=uuid, sku=rec.get("name"), pci_bus_id=rec.get("pci.bus_id")))
        for field, names in _columns_by_field(header):
            # several columns can carry one field (power.draw, .average, .instant): the first readable one in
            # QUERY_FIELDS' order is the sample; with none readable, the first one's cause is recorded
            name = names[0] if len(names) == 1 else \
                next((x for x in names if _readable(_value(rec[x]), field)), names[0])
            c.add_raw(dev, field, t, _value(rec[name]), QUERY_FIELDS[name][1], place=f"line {n} column {name}")
    if header is None:
        raise InputError(path, "", "no nvidia-smi CSV header found")
    return c


_REASON_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
                "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
                "hw_power_brake_slowdown": 0x80, "display_clocks_setting": 0x100}
# Sample field -> the elements that carry it across driver generations, best first (schema v10 <power_readings>,
# v12 <gpu_power_readings> with <power_draw>, driver 575+ with only <instant_power_draw>/<average_power_draw>;
# ECC as single_bit/double_bit totals before v11, sram_/dram_ counters after). The first readable one wins; when
# none is readable the field is missing with the first one's cause.
_XML_FIELDS = (
    ("gpu_util", 0.01, ("utilization/gpu_util",)),
    ("mem_copy_util", 0.01, ("utilization/memory_util",)),
    ("power_w", 1.0, ("gpu_power_readings/instant_power_draw", "gpu_power_readings/power_draw",
                      "power_readings/instant_power_draw", "power_readings/power_draw",
                      "gpu_power_readings/average_power_draw", "power_readings/average_power_draw")),
    ("gpu_temp_c", 1.0, ("temperature/gpu_temp",)),
    ("mem_temp_c", 1.0, ("temperature/memory_temp",)),
    ("sm_clock_mhz", 1.0, ("clocks/sm_clock",)),
    ("mem_clock_mhz", 1.0, ("clocks/mem_clock",)),
    ("fb_used_mib", 1.0, ("fb_memory_usage/used",)),
    ("ecc_sbe_volatile", 1.0, ("ecc_errors/volatile/dram_correctable", "ecc_errors/volatile/single_bit/total")),
    ("ecc_dbe_volatile", 1.0, ("ecc_errors/volatile/dram_uncorrectable", "ecc_errors/volatile/double_bit/total")),
    ("ecc_sbe_aggregate", 1.0, ("ecc_errors/aggregate/dram_correctable", "ecc_errors/aggregate/single_bit/total")),
    ("ecc_dbe_aggregate", 1.0, ("ecc_errors/aggregate/dram_uncorrectable",
                                "ecc_errors/aggregate/double_bit/total")),
    ("row_remap_pending", 1.0, ("remapped_rows/remapped_row_pending",)),
    ("row_remap_failure", 1.0, ("remapped_rows/remapped_row_failure",)),
)
# Text nvidia-smi prints in a value position that is not a number, and the cause recorded for it.
_XML_TEXT = {"yes": "1", "no": "0", "requested functionality has been deprecated": None,
             "not supported": None, "[not supported]": None, "n/a": None, "[n/a]": None, "none": None,
             "unknown error": None, "insufficient permissions": None}
_XML_CAUSE = {"requested functionality has been deprecated": "deprecated", "none": "not_available",
              "n/a": "not_available", "[n/a]": "not_available", "not supported": "not_supported",
              "[not supported]": "not_supported", "insufficient permissions": "no_permission",
              "unknown error": "unknown_error"}
# Compute slices of a MIG profile follow from its SM count: SMs per 1g slice by product (NVIDIA MIG user guide,
# "Supported MIG profiles": A100/A30 1g = 14 SMs, H100/H200 SXM 1g = 16 SMs).
_SMS_PER_SLICE = (("H200", 16), ("H100", 16), ("A100", 14), ("A30", 14))


def _xml_value(el: ET.Element) -> tuple[str | None, str | None]:
    """(raw value for clean(), None) or (None, cause) for an element's text."""
    text = " ".join((el.text or "").split())
    low = text.lower()
    if low in _XML_TEXT:
        v = _XML_TEXT[low]
        return (v, None) if v is not None else (None, _XML_CAUSE.get(low, low.strip("[]").replace(" ", "_")))
    if len(el):   # an element with children where a value was expected (a newer driver's nesting)
        return None, "not_a_value"
    return _value(text), None


def _add_xml_fields(c: Collected, dev: str, el: ET.Element, t: float, place: str,
                    fields: tuple = _XML_FIELDS) -> None:
    for name, scale, paths in fields:
        first_cause = None
        for xp in paths:
            node = el.find(xp)
            if node is None:
                continue
            raw, cause = _xml_value(node)
            if raw is not None:
                try:
                    value, cause = clean(raw, name)
                except BadValue:
                    value = raw   # add_raw records it as unreadable, with a warning naming the element
                if value is not None:
                    c.add_raw(dev, name, t, raw, scale, place=f"{place} <{xp}>")
                    c.note_mapped(xp, name)
                    break
            first_cause = first_cause or cause
        else:
            if first_cause is not None:
                c.add(dev, name, t, None, first_cause, place=place)


def _mig_profile(sku: str | None, sms: str | None, fb_total: str | None) -> str | None:
    """'3g.20gb' from a MIG device's SM count and memory, when the product's SMs per slice are known."""
    per = next((n for key, n in _SMS_PER_SLICE if sku and key in sku), None)
    count = small_index((sms or "").strip())
    mib = _value(fb_total or "")
    if per is None or not count or count % per or not mib.replace(".", "", 1).isdecimal():
        return None
    return f"{count // per}g.{math.ceil(float(mib) / 1024)}gb"   # GiB rounded up, as NVIDIA names profiles


def parse_xml(text: str, path: str = "<input>", *, node: str | None = None, start: float | None = None,
              interval: float | None = None) -> Collected:
    c = Collected("nvidia_smi_xml", path=path)
    docs = [d for d in re.split(r"(?=<\?xml)", text) if d.strip()]
    for k, doc in enumerate(docs):
        try:
            root = ET.fromstring(doc.strip())
        except ET.ParseError as exc:
            line, col = exc.position
            raise InputError(path, f"document {k + 1} line {line} column {col}", "invalid XML") from None
        if root.tag != "nvidia_smi_log":
            raise InputError(path, f"document {k + 1}", f"root <{root.tag}> is not <nvidia_smi_log>")
        ts_el = root.find("timestamp")
        if ts_el is None or not (ts_el.text or "").strip():
            if start is None:
                raise InputError(path, f"document {k + 1}", "no <timestamp>: give --start (and --interval for a loop)")
            t = start + k * (interval or 0.0)
        else:
            try:
                t = _ts(ts_el.text)
            except ValueError:
                raise InputError(path, f"document {k + 1} <timestamp>", f"not a time: '{excerpt(ts_el.text)}'") from None
        driver = (root.findtext("driver_version") or "").strip() or None
        if driver and not c.source_version:
            c.source_version = f"driver {driver}"
        for g in root.findall("gpu"):
            _add_xml_gpu(c, g, t, node, driver, f"document {k + 1}")
    if not docs:
        raise InputError(path, "", "no XML document")
    return c


def _add_xml_gpu(c: Collected, g: ET.Element, t: float, node: str | None, driver: str | None, place: str) -> None:
    uuid = (g.findtext("uuid") or "").strip() or None
    minor = (g.findtext("minor_number") or "").strip()
    key = uuid or f"{node or 'unknown-node'}/{g.get('id')}"
    sku = (g.findtext("product_name") or "").strip() or None
    partitioned = (g.findtext("mig_mode/current_mig") or "").strip() == "Enabled"
    dev = c.device(DeviceInfo(device=key, node=node, index=small_index(minor), uuid=uuid, sku=sku,
                              pci_bus_id=g.get("id"), driver=driver, partitioned=partitioned))
    _add_xml_fields(c, dev, g, t, place)
    reasons = g.find("clocks_event_reasons")
    if reasons is None:
        reasons = g.find("clocks_throttle_reasons")
    if reasons is not None:
        mask, known = 0, False
        for child in reasons:
            name = re.sub(r"^clocks_(event|throttle)_reason_", "", child.tag)
            state = " ".join((child.text or "").split()).lower()
            if name in _REASON_BITS and state in ("active", "not active"):
                known = True
                mask |= _REASON_BITS[name] if state == "active" else 0
        c.add(dev, "clock_reasons", t, float(mask) if known else None, None if known else "not_available",
              place=place)
    procs = g.find("processes")
    infos = procs.findall("process_info") if procs is not None else []
    if procs is not None:
        c.add(dev, "compute_procs", t, float(sum(1 for p in infos if (p.findtext("type") or "C").strip() != "G")),
              place=place)
    # A MIG instance is its own device (parent UUID + GPU instance id), with its own memory and processes.
    for m in g.findall("mig_devices/mig_device"):
        gi = (m.findtext("gpu_instance_id") or "").strip()
        if not gi.isdecimal() or uuid is None:
            continue
        profile = _mig_profile(sku, m.findtext("device_attributes/shared/multiprocessor_count"),
                               m.findtext("fb_memory_usage/total"))
        mdev = c.device(DeviceInfo(device=f"{uuid}/gi{gi}", node=node, index=small_index(minor), uuid=uuid, sku=sku,
                                   pci_bus_id=g.get("id"), driver=driver, mig_profile=profile, mig_instance=gi))
        _add_xml_fields(c, mdev, m, t, f"{place} mig_device gi {gi}", (_XML_FIELDS[7],))
        if procs is not None:
            mine = sum(1 for p in infos if (p.findtext("gpu_instance_id") or "").strip() == gi)
            c.add(mdev, "compute_procs", t, float(mine), place=place)


def parse(text: str, path: str = "<input>", **kw) -> Collected:
    if text.lstrip().startswith("<"):
        return parse_xml(text, path, **kw)
    return parse_csv(text, path, **kw)


def read(path: str | Path, **kw) -> Collected:
    """A capture file: CSV read line by line, XML whole (one document per query; :func:`parse_xml`)."""
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(4096)
    if head.strip() and b"\x00" not in head and not head.decode("utf-8", "ignore").lstrip().startswith("<"):
        return parse_csv(read_lines(p), str(p), **kw)
    return parse(decode_text(p.read_bytes(), str(p)), str(p), **kw)
