"""Prometheus / dcgm-exporter inputs: query_range JSON (files, JSON Lines, directories, tar/zip), the long CSV,
the text exposition (scrapes, OpenMetrics with timestamps), and live chunked ``query_range`` over HTTP (GET only).

Labels across dcgm-exporter versions: ``UUID``, ``gpu``, ``modelName``, ``pci_bus_id``, ``Hostname`` or
``hostname`` (else a ``node`` label or ``instance``), MIG ``GPU_I_ID``/``GPU_I_PROFILE``, ``DCGM_FI_DRIVER_VERSION``.
The workload on a device (docs/telemetry.md, "Workload identity") comes from ``exported_*`` or Kubernetes
``namespace``/``pod``/``container`` labels that do not name the exporter itself (legacy ``pod_namespace``/
``pod_name``/``container_name``) and Slurm ``hpc_job`` (also ``slurm_job_id``/``job_id``). Metrics we do not map
are reported as unmapped; terminal noise around a saved scrape is skipped and counted.

ROCm device-metrics-exporter's ``amd_*`` series are read beside them (:mod:`.amd_exporter_fields`; devices from
``gpu_uuid`` or ``hostname``/``gpu_id``, SKU from ``card_model``); its op counters become each sample's
``fp_ops`` (:mod:`.op_counters`).
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Mapping, NamedTuple

from .bounded import DEFAULT_LIMITS, ArchiveLimits, DirFile, archive_members, directory_files, is_archive, open_file
from ..base.textsafe import excerpt
from .common import Collected, CsvReader, Context, DeviceInfo, InputError, decode_text, noise_reason, read_lines
from .amd_exporter_fields import AMD_BY_NAME
from .dcgm_fields import AMBIGUOUS_NAMES, BY_NAME as DCGM_BY_NAME
from .prometheus_stream import WholeFile, add_result_series, check_response, read_query_range

MAX_POINTS_PER_SERIES = 11_000    # Prometheus refuses (end-start)/step above this (web/api/v1/api.go)
CHUNK_POINTS = 10_000             # what we ask for per call, with margin
JOB_LABELS = ("hpc_job", "slurm_job_id", "job_id", "slurm_job")
# dcgm-exporter's names and ROCm device-metrics-exporter's (``amd_*``, ledger/importers/amd_exporter_fields.py)
BY_NAME = {**DCGM_BY_NAME, **AMD_BY_NAME}


def _nonempty(labels: Mapping[str, str], *names: str) -> str | None:
    for n in names:
        v = labels.get(n)
        if v not in (None, ""):
            return v
    return None


# The exporter's own pod, as the target labels of a Kubernetes scrape name it (ServiceMonitor / pod role):
# nvidia-dcgm-exporter-57pvc, dcgm-exporter-x2k9p, gpu-operator's container nvidia-dcgm-exporter.
_EXPORTER = re.compile(r"(^|-)dcgm-exporter(-|$)")


def _is_exporter(pod: str | None, container: str | None) -> bool:
    return bool(pod and _EXPORTER.search(pod)) or bool(container and _EXPORTER.search(container))


def node_from_labels(labels: Mapping[str, str]) -> str | None:
    """The GPU's node: dcgm-exporter's Hostname, unless that is the exporter pod's own name (no hostNetwork),
    then a node label a relabel rule added, else the scrape target's host."""
    host = _nonempty(labels, "Hostname", "hostname")
    if host is not None and not _EXPORTER.search(host):
        return host
    node = _nonempty(labels, "node", "kubernetes_node", "exported_node", "nodename")
    if node is not None:
        return node
    if host is not None:
        return host
    return labels["instance"].rsplit(":", 1)[0] if labels.get("instance") else None


def device_from_labels(labels: Mapping[str, str], c: Collected) -> str:
    node = node_from_labels(labels)
    uuid = _nonempty(labels, "UUID", "uuid")
    gpu = _nonempty(labels, "gpu")
    gi = _nonempty(labels, "GPU_I_ID")
    if uuid:
        key = uuid if gi is None else f"{uuid}/gi{gi}"
    else:
        where = labels.get("instance") or node or "unknown-node"   # the full instance: two exporters, two devices
        key = f"{where}/gpu{gpu if gpu is not None else '?'}" + (f"/gi{gi}" if gi else "")
    index = None
    if gpu is not None:
        try:
            index = int(gpu)
        except ValueError:
            index = None
    return c.device(DeviceInfo(device=key, node=node, index=index, uuid=uuid, sku=_nonempty(labels, "modelName"),
                               pci_bus_id=_nonempty(labels, "pci_bus_id"), mig_profile=_nonempty(labels, "GPU_I_PROFILE"),
                               mig_instance=gi, driver=_nonempty(labels, "DCGM_FI_DRIVER_VERSION")))


def amd_device_from_labels(labels: Mapping[str, str], c: Collected) -> str:
    """A device of ROCm device-metrics-exporter: its labels (gpu_id, serial_number, card_model, hostname,
    gpu_partition_id; gpu_uuid when enabled) as pkg/amdgpu/gpuagent/gpuagent_metrics.go writes them."""
    node = node_from_labels(labels)
    uuid = _nonempty(labels, "gpu_uuid")
    gpu = _nonempty(labels, "gpu_id")
    part = _nonempty(labels, "gpu_partition_id")
    if uuid:
        key = uuid
    else:
        where = node or labels.get("instance") or "unknown-node"
        key = f"{where}/gpu{gpu if gpu is not None else '?'}" + (f"/p{part}" if part not in (None, "0") else "")
    index = int(gpu) if gpu is not None and gpu.isdecimal() and len(gpu) <= 9 else None
    return c.device(DeviceInfo(device=key, node=node, index=index, uuid=uuid, sku=_nonempty(labels, "card_model"),
                               vendor="amd",
                               driver=_nonempty(labels, "driver_version")))


def workload_from_labels(labels: Mapping[str, str]) -> tuple[str | None, str | None, str | None]:
    """(namespace, pod, container) of the workload on the GPU, or Nones (docs/telemetry.md, "Workload identity").

    dcgm-exporter's pod mapping writes the workload's namespace/pod/container. When Prometheus scrapes the
    exporter through Kubernetes discovery it attaches the exporter pod's own namespace/pod/container as target
    labels; with honor_labels false the workload's labels are then renamed exported_*. So exported_* always win;
    plain labels are the workload's only when they do not name the exporter itself.
    """
    ns = _nonempty(labels, "exported_namespace")
    pod = _nonempty(labels, "exported_pod")
    if ns and pod:
        return ns, pod, _nonempty(labels, "exported_container")
    ns = _nonempty(labels, "namespace", "pod_namespace")
    pod = _nonempty(labels, "pod", "pod_name")
    container = _nonempty(labels, "container", "container_name")
    if not (ns and pod) or _is_exporter(pod, container):
        return None, None, None
    return ns, pod, container


def context_from_labels(labels: Mapping[str, str]) -> Context | None:
    """Who held the device: a Slurm job (hpc_job; tenant = its account label, else the workload's namespace) or a
    Kubernetes workload (job id namespace/pod, tenant = namespace); None for an idle GPU or the exporter itself."""
    ns, pod, container = workload_from_labels(labels)
    job = _nonempty(labels, *JOB_LABELS)
    if job is not None:
        return Context("slurm", job, _nonempty(labels, "account", "slurm_account") or ns,
                       (("namespace", ns),) if ns else ())
    if ns and pod:
        return Context("k8s", f"{ns}/{pod}", ns, (("container", container or ""),))
    return None


def add_series(c: Collected, labels: Mapping[str, str], points: Iterable, place: str) -> None:
    """One time series ([t, "value"] pairs) into the collection; unmapped metrics are skipped."""
    name = labels.get("__name__", "")
    spec = BY_NAME.get(name)
    if spec is None:
        if name in AMBIGUOUS_NAMES and name not in c.unmapped:
            c.warn(f"{c.path}: {place}: {name}: {AMBIGUOUS_NAMES[name]}")
        c.note_unmapped(name)
        return
    c.note_mapped(name, "fp_ops" if spec.target.startswith("ops_") else spec.target)
    dev = (amd_device_from_labels if name in AMD_BY_NAME else device_from_labels)(labels, c)
    ctx = context_from_labels(labels)
    if not isinstance(points, list):
        points = list(points)
    if points and set(map(type, points)) <= {list, tuple} and set(map(len, points)) == {2}:
        if _add_columns(c, dev, ctx, spec, [p[0] for p in points], [p[1] for p in points], place):
            return
    for i, p in enumerate(points):
        try:
            t, raw = p
            t = float(t)
        except (TypeError, ValueError):
            raise InputError(c.path, f"{place} point {i}", f"expected [timestamp, \"value\"], got {excerpt(p)}") from None
        c.add_raw(dev, spec.target, t, raw, spec.scale, place=f"{place} point {i}")
        if ctx is not None:
            c.note_context(dev, ctx, t)


def _add_columns(c: Collected, dev: str, ctx: Context | None, spec, ts: list, raws: list,  # noqa: ANN001
                 place: str) -> bool:
    """A whole series at once (False: a value needs the per-value path)."""
    tarr = c.add_raw_many(dev, spec.target, ts, raws, spec.scale, place=place)
    if tarr is None:
        return False
    if ctx is not None and len(tarr):
        c.note_context(dev, ctx, float(tarr.min()))
        c.note_context(dev, ctx, float(tarr.max()))
    return True


def _load_json(text: str, path: str, line_offset: int = 0):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"line {exc.lineno + line_offset} column {exc.colno}", f"invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(path, f"line {1 + line_offset}", "JSON nested too deeply for a Prometheus response") from None
    except ValueError as exc:  # int()'s digit limit on a 4,300-digit number
        raise InputError(path, f"line {1 + line_offset}", f"invalid JSON ({exc})") from None


def _add_response(c: Collected, doc, place: str) -> None:
    rtype, result = check_response(c, doc, place)
    for k, series in enumerate(result):
        add_result_series(c, k, series, rtype, place, add_series)


def parse_query_range(text: str, path: str = "<input>") -> Collected:
    c = Collected("prometheus", path=path)
    _add_response(c, _load_json(text, path), "")
    return c


def _lines(text: str | Iterable[str]) -> Iterable[str]:
    """A text's lines, or the lines already read from a file one at a time (:func:`common.read_lines`)."""
    return text.splitlines() if isinstance(text, str) else text


def parse_jsonl(text: str | Iterable[str], path: str = "<input>") -> Collected:
    """JSON Lines: one query_range response per line (what a chunked export script appends)."""
    c = Collected("prometheus", path=path)
    for n, line in enumerate(_lines(text), start=1):
        if line.strip():
            _add_response(c, _load_json(line, path, n - 1), f"line {n}")
    return c


def _parse_ts(s: str) -> float:
    s = s.strip()
    try:
        return float(s)
    except ValueError:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


CSV_BATCH_ROWS = 50_000


def parse_csv(text: str | Iterable[str], path: str = "<input>") -> Collected:
    """Long CSV: ``timestamp,metric|__name__,<label columns>...,value`` (unix seconds or RFC 3339).

    Rows are gathered per series in batches of :data:`CSV_BATCH_ROWS` and each batch added column-wise; a
    batch with a value the column path declines is added row by row, so an error names its line.
    """
    c = Collected("prometheus", path=path)
    reader = CsvReader(text if isinstance(text, str) else (ln + "\n" for ln in text), path)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputError(path, "", "empty file") from None
    low = [h.lower() for h in header]
    ti = next((i for i, h in enumerate(low) if h in ("timestamp", "time", "ts")), None)
    mi = next((i for i, h in enumerate(low) if h in ("metric", "__name__", "name")), None)
    vi = next((i for i, h in enumerate(low) if h == "value"), None)
    if ti is None or mi is None or vi is None:
        raise InputError(path, "line 1", f"wrong columns: need timestamp, metric (or __name__) and value; got {excerpt(','.join(header), 80)}")
    label_cols = [(i, h) for i, h in enumerate(header) if i not in (ti, mi, vi)]
    batch: dict[tuple, tuple[list, list, list]] = {}
    rows = 0
    for row in reader:
        line = reader.line_num
        if not row or all(not x.strip() for x in row):
            continue
        if len(row) != len(header):
            raise InputError(path, f"line {line}", f"{len(row)} columns, header has {len(header)}")
        try:
            t = _parse_ts(row[ti])
        except ValueError:
            raise InputError(path, f"line {line}", f"timestamp: not a time: '{excerpt(row[ti])}'") from None
        name = row[mi].strip()
        if name not in BY_NAME:
            continue
        ts, raws, lines = batch.setdefault((name, *(row[i] for i, _ in label_cols)), ([], [], []))
        ts.append(t)
        raws.append(row[vi])
        lines.append(line)
        rows += 1
        if rows >= CSV_BATCH_ROWS:
            _add_csv_batch(c, batch, label_cols)
            batch, rows = {}, 0
    _add_csv_batch(c, batch, label_cols)
    return c


def _add_csv_batch(c: Collected, batch: dict[tuple, tuple[list, list, list]], label_cols: list) -> None:
    for key, (ts, raws, lines) in batch.items():
        labels = {h: key[k + 1] for k, (_i, h) in enumerate(label_cols)}
        labels["__name__"] = key[0]
        dev = (amd_device_from_labels if key[0] in AMD_BY_NAME else device_from_labels)(labels, c)
        try:
            done = _add_columns(c, dev, context_from_labels(labels), BY_NAME[key[0]], ts, raws, f"line {lines[0]}")
        except InputError:
            done = False   # (nothing was stored) row by row below, for the error's own line
        if not done:
            for t, raw, line in zip(ts, raws, lines):
                add_series(c, labels, [(t, raw)], f"line {line}")


_LINE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+(\S+))?\s*$')
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _labels(s: str, path: str, place: str) -> dict[str, str]:
    out, pos = {}, 0
    s = s.strip()
    while pos < len(s):
        m = _LABEL.match(s, pos)
        if m is None:
            raise InputError(path, place, f"bad label set near '{excerpt(s[pos:])}'")
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out


def parse_exposition(text: str | Iterable[str], path: str = "<input>", default_ts: float | None = None,
                     openmetrics: bool | None = None) -> Collected:
    """Prometheus text format / OpenMetrics. OpenMetrics timestamps are seconds, the classic format's are ms.

    A scrape without timestamps needs ``default_ts`` (the scrape time). ``...`` lines (documentation
    elisions, as in dcgm-exporter's README) are skipped.
    """
    c = Collected("prometheus", path=path)
    if openmetrics is None:
        openmetrics = "\n# EOF" in "\n" + text
    first_bad: tuple[int, str] | None = None
    for n, line in enumerate(_lines(text), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _LINE.match(s)
        if m is None:   # only then can it be noise: no noise line has the shape of a sample (tested)
            noise = noise_reason(s)
            c.skip(f"line {n}", noise or "not_an_exposition_line", s)
            if noise is None:
                first_bad = first_bad or (n, s)
            continue
        try:
            labels = _labels(m.group(3) or "", path, f"line {n}")
        except InputError:
            c.skip(f"line {n}", "bad_label_set", s)
            first_bad = first_bad or (n, s)
            continue
        labels["__name__"] = m.group(1)
        ts_s = m.group(5)
        if ts_s is None:
            if default_ts is None:
                raise InputError(path, f"line {n}", "sample has no timestamp: a scrape without timestamps needs "
                                                    "its scrape time (--at, epoch seconds or RFC 3339)")
            t = default_ts
        else:
            try:
                t = float(ts_s)
            except ValueError:
                c.skip(f"line {n}", "bad_timestamp", s)
                first_bad = first_bad or (n, s)
                continue
            if not openmetrics and t > 1e11:
                t /= 1000.0
        add_series(c, labels, [(t, m.group(4))], f"line {n}")
    if c.points == 0 and not c.unmapped and first_bad is not None:
        raise InputError(path, f"line {first_bad[0]}", f"expected an exposition line (metric{{labels}} value "
                                                       f"[timestamp]), got '{excerpt(first_bad[1])}'")
    return c


def sniff(text: str) -> str:
    body = text.lstrip()
    head = body[:4096]
    if head.startswith("{"):
        nl = body.find("\n")
        first = (body if nl < 0 else body[:nl]).strip()
        if first.endswith("}") and nl >= 0 and body[nl:].strip():
            try:
                json.loads(first)
                return "jsonl"
            except (ValueError, RecursionError):
                pass
        return "json"
    first_line = head.split("\n", 1)[0].lower()
    if "," in first_line and ("timestamp" in first_line or "time" in first_line) and "value" in first_line:
        return "csv"
    return "text"


def _blank_noise_head(text: str) -> tuple[str, list[tuple[int, str, str]]]:
    """Terminal noise before the export (kubectl's "Handling connection for 9090", a prompt) blanked out, so line
    numbers stay true; returns the text and the (line, reason, text) of what was blanked."""
    lines = text.split("\n")
    gone = []
    for i, ln in enumerate(lines):
        s = ln.strip()
        if not s:
            continue
        why = noise_reason(s)
        if why is None or s.startswith("#"):
            break
        gone.append((i + 1, why, s))
        lines[i] = ""
    return ("\n".join(lines), gone) if gone else (text, gone)


def parse(text: str, path: str = "<input>", default_ts: float | None = None) -> Collected:
    text, gone = _blank_noise_head(text)
    c = _parse_kind(text, path, default_ts)
    for n, why, s in gone:
        c.skip(f"line {n}", why, s)
    return c


def _parse_kind(text: str, path: str, default_ts: float | None) -> Collected:
    kind = "csv" if path.lower().endswith(".csv") else sniff(text)
    if kind == "json":
        return parse_query_range(text, path)
    if kind == "jsonl":
        return parse_jsonl(text, path)
    if kind == "csv":
        return parse_csv(text, path)
    return parse_exposition(text, path, default_ts)


def _members(path: Path, limits: ArchiveLimits = DEFAULT_LIMITS) -> Iterator[tuple[str, bytes]]:
    return archive_members(path, limits)


def read(paths: str | Path | Iterable[str | Path], default_ts: float | None = None,
         workers: int | None = None, while_reading: Callable[[], None] | None = None,
         limits: ArchiveLimits = DEFAULT_LIMITS) -> Collected:
    """One file, several files, a directory, or a tar/zip of exports, merged into one collection (in the order
    given, a directory's files sorted by name). Files on disk are never held whole (see :func:`_read_file`).
    Bounded and inert (:mod:`ledger.importers.bounded`): an archive within ``limits``, never one inside it; a
    directory's symbolic links are never followed (each is named in a warning).

    ``workers``: processes that parse files on disk while this one merges (None: one per CPU, at most
    :data:`READ_WORKERS`; 0: all in this process, the reference :func:`parsed_in_workers` is held to).
    ``while_reading``: work for this process while the workers parse (``analyze`` imports the agents then); it
    runs before the reading when there are no workers."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path | DirFile | _Archive] = []   # a file on disk, or a tar/zip whose members are read in turn
    links: list[str] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise InputError(str(p), "", "no such file or directory")
        if p.is_dir():
            found, skipped = directory_files(p)
            files.extend(q for q in found if not _aside(q.name))
            links += skipped
        elif is_archive(p):
            files.append(_Archive(p, limits))
        else:
            files.append(p)
    out: Collected | None = None
    for c in parsed_in_workers(files, default_ts, workers, while_reading):
        if out is None:
            out = c
        else:
            out.merge(c)
    if out is None:
        raise InputError(str(paths), "", "no export files found")
    for name in links:
        out.warn(f"{name}: a symbolic link or not a regular file; not followed, not read")
    return out


READ_WORKERS = 2          # an export is a file per metric: two parsers keep a 2-CPU machine busy, more rarely help


class _Archive(NamedTuple):
    """A tar or zip of export files: its members are read one at a time, in name order, when their turn comes
    (one member's bytes in memory, never the archive's)."""
    path: Path
    limits: ArchiveLimits = DEFAULT_LIMITS


def _parsed(f: Path | _Archive, default_ts: float | None) -> Iterator[Collected]:
    """The collections of a file on disk (one) or of an archive's members (one each)."""
    if isinstance(f, _Archive):
        for name, data in _members(f.path, f.limits):
            if not _aside(name):
                yield parse(decode_text(data, name), name, default_ts)
    else:
        yield _read_file(f, default_ts)


def parsed_in_workers(files: list[Path | _Archive], default_ts: float | None, workers: int | None,
                      while_reading: Callable[[], None] | None = None) -> Iterator[Collected]:
    """Each file's collection, in order: parsed here one after another (``workers`` 0, the reference), or by
    worker processes when there are several files on disk and a second CPU (archive members are parsed here, in
    their turn). The same collections and the same first error either way (tests/test_prometheus_stream.py);
    what is merged stays in this process."""
    import multiprocessing
    import os
    import threading

    if workers is None:
        workers = min(os.cpu_count() or 1, READ_WORKERS)
    on_disk = sum(1 for f in files if not isinstance(f, _Archive))
    if (workers < 2 or on_disk < 2 or threading.active_count() != 1
            or "fork" not in multiprocessing.get_all_start_methods()):
        if while_reading is not None:
            while_reading()
        for f in files:
            yield from _parsed(f, default_ts)
        return
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    # fork: a single-threaded caller forks in milliseconds; the workers only read the files they are given.
    # Every file is handed out at once, so the workers never wait for this process (it imports the agents
    # meanwhile); a parsed file waiting here holds what merging it will add, so memory stays what the merged
    # collection comes to, plus a file.
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    try:
        pending = deque(f if isinstance(f, _Archive) else pool.submit(_read_file, f, default_ts) for f in files)
        if while_reading is not None:
            while_reading()
        while pending:
            yield from _taken(pending.popleft(), default_ts)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _taken(item, default_ts: float | None) -> Iterator[Collected]:  # noqa: ANN001 - an _Archive or a Future
    if isinstance(item, _Archive):
        yield from _parsed(item, default_ts)
    else:
        yield item.result()


def _aside(name: str) -> bool:
    """A file kept beside an export that is none of it (a sample's provenance note, a README)."""
    return name.endswith((".source.txt", ".md"))


def _read_file(p: Path | DirFile, default_ts: float | None) -> Collected:
    """One export file: streamed when its kind allows (every kind but one with terminal noise before it), else
    read whole and parsed by :func:`parse`. A directory's file is opened only through
    :func:`~ledger.importers.bounded.open_file` (never through a symbolic link)."""
    c = _stream(p, default_ts)
    if c is not None:
        return c
    with open_file(p) as f:
        data = f.read()
    return parse(decode_text(data, str(p)), str(p), default_ts)


def _stream(p: Path | DirFile, default_ts: float | None) -> Collected | None:
    """A single export file parsed while it is read, so a file of gigabytes is never held whole: long CSV, JSON
    Lines and the text exposition line by line, a query_range response series by series; None for a file with
    terminal noise before the export (read whole, where parse() blanks the noise out), or a response that cannot
    be read in one pass (:class:`~ledger.importers.prometheus_stream.WholeFile`)."""
    with open_file(p) as f:
        head_bytes = f.read(4096)
        head = head_bytes.decode("utf-8", "ignore").lstrip()
        if _blank_noise_head(head)[1] or not head_bytes.strip() or b"\x00" in head_bytes:
            return None   # noise before the export, or what decode_text refuses: read whole
        if head.startswith("{"):
            kind = _json_kind(f)
            if kind == "json":
                f.seek(0)
                try:
                    return read_query_range(f, str(p), add_series)
                except WholeFile:
                    return None
        elif p.name.lower().endswith(".csv") or sniff(head) == "csv":
            kind = "csv"
        else:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            kind = "openmetrics" if b"# EOF" in f.read() else "text"
    if p.name.lower().endswith(".csv"):
        kind = "csv"
    lines = read_lines(p, lambda: open_file(p))
    if kind == "jsonl":
        return parse_jsonl(lines, str(p))
    if kind == "csv":
        return parse_csv(lines, str(p))
    return parse_exposition(lines, str(p), default_ts, openmetrics=kind == "openmetrics")


def _json_kind(f: BinaryIO) -> str:
    """"jsonl" when the file's first line is a whole object and another follows (found without reading it all;
    :func:`sniff`'s rule), else "json"."""
    f.seek(0)
    offset = 0
    while (chunk := f.read(1 << 20)) and b"\n" not in chunk:
        offset += len(chunk)
    if not chunk:
        return "json"
    newline = offset + chunk.index(b"\n")
    f.seek(max(0, newline - 64))
    around = f.read(newline - max(0, newline - 64) + 4096)
    first_end, rest = around.split(b"\n", 1) if b"\n" in around else (around, b"")
    if not first_end.rstrip().endswith(b"}") or not rest.lstrip().startswith(b"{"):
        return "json"
    return "jsonl"


# --- live: chunked query_range over HTTP ---------------------------------------------------------------------

def _get(url: str, timeout: float) -> dict:
    req = urllib.request.Request(url, method="GET", headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (operator-given URL, GET only)
            body = resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace")
        raise InputError(url.split("?")[0], "", f"HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise InputError(url.split("?")[0], "", f"cannot reach Prometheus: {getattr(exc, 'reason', exc)}") from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise InputError(url.split("?")[0], "", "response is not JSON") from None


def chunks(start: float, end: float, step: float, max_points: int = CHUNK_POINTS) -> list[tuple[float, float]]:
    """[start, end] (inclusive, like query_range) split so each call returns at most ``max_points`` per series."""
    if step <= 0 or end < start:
        raise ValueError("need step > 0 and end >= start")
    out, s = [], start
    width = (max_points - 1) * step
    while s <= end:
        e = min(end, s + width)
        out.append((s, e))
        s = e + step
    return out


def fresh_only(metric: str, step: float) -> str:
    """Only samples scraped within the last step: Prometheus' 5-minute lookback would otherwise fill holes."""
    return f"{metric} and (time() - timestamp({metric}) < {step:g})"


def fetch(base_url: str, start: float, end: float, step: float, *, metrics: Iterable[str] | None = None,
          timeout: float = 60.0, progress: Callable[[int, int], None] | None = None) -> Collected:
    """Live import: for each mapped DCGM metric the server has, chunked query_range calls (GET)."""
    base = base_url.rstrip("/")
    if metrics is None:
        names = _get(f"{base}/api/v1/label/__name__/values", timeout).get("data", [])
        metrics = sorted(n for n in names if n in BY_NAME)
    metrics = list(metrics)
    c = Collected("prometheus", path=base, cadence=step, span=(start, end + step))
    windows = chunks(start, end, step)
    total, done = len(metrics) * len(windows), 0
    for m in metrics:
        for s, e in windows:
            q = urllib.parse.urlencode({"query": fresh_only(m, step), "start": f"{s:.3f}", "end": f"{e:.3f}",
                                        "step": f"{step:g}"})
            doc = _get(f"{base}/api/v1/query_range?{q}", timeout)
            sub = Collected("prometheus", path=base)
            _add_response(sub, doc, f"{m} [{s:.0f},{e:.0f}]")
            c.merge(sub)
            done += 1
            if progress:
                progress(done, total)
    c.span = (start, end + step)
    c.cadence = step
    return c
