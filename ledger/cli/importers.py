"""`ipledger import prometheus|dmon|amd-smi|nvidia-smi SOURCE` and `ipledger pathb-command`: telemetry exports."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Callable

import click

from ..importers import columnar, nvidia_smi, pipeline, prometheus
from ..importers.common import Collected, InputError
from ..importers.dcgm_fields import COLLECT_FIELD_IDS
from ..base.textsafe import echo
from .context import AppContext, UserError, emit_json, pass_app


def parse_time(value: str | None, name: str) -> float | None:
    """Epoch seconds or RFC 3339 (``Z`` allowed; a naive time is read as UTC)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{name}: not a time (epoch seconds or RFC 3339): {value!r}") from None
    if dt.tzinfo is None:
        from datetime import timezone

        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def parse_duration(value: str | None, name: str) -> float | None:
    """'15', '15s', '500ms', '1m', '1h' -> seconds."""
    if value is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", value)
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"{name}: not a positive duration (e.g. 15s, 500ms, 1m): {value!r}")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def _progress(quiet: bool) -> Callable[[int, int], None] | None:
    from ..base.progressbar import progress_for

    return progress_for("import", quiet)


def parse_tenants(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``--tenant LABEL_VALUE=TENANT`` options -> the site's mapping (a namespace or account -> its tenant)."""
    out = []
    for v in values:
        key, sep, tenant = v.partition("=")
        if not sep or not key or not tenant:
            raise UserError(f"--tenant: expected LABEL_VALUE=TENANT (e.g. ml-prod=team-ml), got {v!r}")
        out.append((key, tenant))
    return tuple(sorted(out))


def _report_exporter_version(parse: Callable[[], Collected], exporter_version: str | None) -> Callable[[], Collected]:
    """The parse, with a note that the exporter version given changes no unit (it is only reported).

    Field 156 is mJ and field 1611 J in every DCGM / dcgm-exporter version (:func:`ledger.method.energy.
    joules_per_count`): units come from the field, never from a version, so no reading is rescaled.
    """
    if exporter_version is None:
        return parse

    def parsed() -> Collected:
        c = parse()
        c.warn(f"{c.path}: --dcgm-exporter-version {exporter_version}: reported only; energy units come from the "
               f"field (156 mJ, 1611 J, in every version), nothing rescaled")
        return c
    return parsed


def _run(app: AppContext, parse: Callable[[], Collected], cluster: str, synthetic: bool, as_json: bool,
         quiet: bool, span: tuple | None = None, cadence: float | None = None,
         tenants: tuple[tuple[str, str], ...] = ()) -> None:
    engine = app.engine()
    try:
        collected = parse()
    except InputError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"{getattr(exc, 'filename', '') or ''}: {exc.strerror or exc}") from None
    if not collected.series:
        raise UserError(f"{collected.path}: no telemetry this importer maps (see docs/telemetry.md)")
    opts = pipeline.ImportOptions(cluster=cluster, synthetic_runs=synthetic, span=span, cadence=cadence,
                                  tenants=tenants)
    from ..chain.store import get_head

    before = get_head(engine)[0]
    result = pipeline.write(engine, collected, opts, progress=_progress(quiet))
    receipts = _issue_closed(app, engine, before)
    for job, nodes in sorted(result.clock_skew.items()):
        for node, ahead in sorted(nodes.items()):
            echo(f"ipledger: warning: {collected.path}: job {job}: {node}'s telemetry runs {ahead:g} s ahead of "
                       f"the run's first node at both ends: clock skew? (flagged on the run as clock_skew_s)", err=True)
    if as_json:
        emit_json({**result.to_json(), **({"receipts": receipts.to_json()} if receipts else {})})
        return
    if receipts:
        echo(f"receipts of the {receipts.runs} runs the import closed: {receipts.issued} issued, "
                   f"{receipts.reissued} re-issued, {receipts.unchanged} unchanged, {len(receipts.failed)} failed")
    echo(f"imported {result.samples} samples of {result.devices} devices from {collected.source}: "
               f"{result.segments} segments, {result.unknown_intervals} unknown intervals "
               f"({result.unknown_seconds / 3600:.2f} device-hours), {result.counter_resets} counter resets, "
               f"{result.runs} synthetic runs; {result.appended} entries appended, {result.duplicates} already there")
    for name, reasons in sorted(result.missing.items()):
        echo(f"  not measured: {name}: " + ", ".join(f"{k} x{v}" for k, v in sorted(reasons.items())))
    if collected.skipped:
        echo("  skipped lines: " + ", ".join(f"{k} x{v}" for k, v in sorted(collected.skipped.items())))
    if collected.unmapped:
        echo("  not mapped: " + ", ".join(f"{k} x{v}" for k, v in sorted(collected.unmapped.items())))
    for w in collected.all_warnings():
        echo(f"  warning: {w}")


def _issue_closed(app: AppContext, engine, after_seq: int):  # noqa: ANN001, ANN202
    """Issue the receipts of the runs this import closed (as `ship` does for the epilog's), unless the site
    turned automatic receipts off; None when off or when the import closed no run."""
    from ..receipts.issue import issue_runs, runs_to_issue

    try:  # the import itself is done: a broken site config skips the receipts
        site = app.site
    except UserError as exc:
        echo(f"ipledger: warning: receipts not issued: {exc.message}", err=True)
        return None
    if not site.auto_receipts:
        return None
    keys = runs_to_issue(engine, after_seq=after_seq)
    return issue_runs(engine, keys, sku_table=site.sku_table, lens=site.lens,
                      carbon=site.carbon) if keys else None


def _common(f):  # noqa: ANN001, ANN202
    f = click.option("--quiet", is_flag=True, help="No progress on stderr.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the import summary as JSON.")(f)
    f = click.option("--no-synthetic-runs", is_flag=True,
                     help="Do not create synthetic allocations from labels (or one per node).")(f)
    f = click.option("--cluster", default="pathb", show_default=True, help="Cluster name of the entries.")(f)
    f = click.option("--tenant", "tenant", multiple=True, metavar="VALUE=TENANT",
                     help="Site mapping: a namespace or Slurm account label value -> the tenant it bills (repeatable).")(f)
    return f


def _timing(f):  # noqa: ANN001, ANN202
    f = click.option("--node", help="Host the capture was taken on (else from the metadata line).")(f)
    f = click.option("--interval", help="Sampling interval of the capture (e.g. 1s, 500ms).")(f)
    f = click.option("--start", help="Capture start (epoch seconds or RFC 3339).")(f)
    return f


def register(cli: click.Group) -> None:
    @cli.group("import")
    def import_group() -> None:
        """Import telemetry exports into the ledger (samples, gaps, synthetic runs).

        \b
        Example:
          ipledger import prometheus export/            # query_range JSON files, a tar/zip, CSV, OpenMetrics
          ipledger import prometheus --url http://127.0.0.1:9090 --start 2026-01-01T00:00:00Z \\
              --end 2026-01-02T00:00:00Z --step 15s
          ipledger import dmon dmon.txt --start 2026-01-01T00:00:00Z --interval 1s --node gpu-07
        """

    @import_group.command("prometheus")
    @click.argument("source", nargs=-1, type=click.Path())
    @click.option("--url", help="Live: a Prometheus base URL (GET /api/v1/query_range only).")
    @click.option("--start", help="Range start (epoch or RFC 3339); live: required; files: the export's span.")
    @click.option("--end", help="Range end (inclusive, like query_range).")
    @click.option("--step", help="Live: query step = the scrape cadence (default 15s).")
    @click.option("--at", "at", help="Scrape time for exposition files without timestamps.")
    @click.option("--dcgm-exporter-version", "exporter_version", metavar="VERSION",
                  help="The exporter's version, reported only: energy units come from the field id "
                       "(156 mJ, 1611 J, in every version), nothing is rescaled.")
    @_common
    @pass_app
    def import_prometheus(app: AppContext, source: tuple[str, ...], url: str | None, start: str | None,
                          end: str | None, step: str | None, at: str | None, exporter_version: str | None,
                          cluster: str, tenant: tuple[str, ...],
                          no_synthetic_runs: bool, as_json: bool, quiet: bool) -> None:
        """Prometheus / dcgm-exporter data: files (query_range JSON, JSON Lines, dir, tar/zip, long CSV,
        text exposition / OpenMetrics) or live chunked query_range calls.

        \b
        Example:
          ipledger import prometheus dcgm-24h.tar.gz --json
          ipledger import prometheus query.json --tenant ml-prod=team-ml --tenant physics=dept-physics
          ipledger import prometheus --url http://127.0.0.1:9090 --start 1767225600 --end 1767311940 --step 60s
        """
        t0, t1 = parse_time(start, "--start"), parse_time(end, "--end")
        step_s = parse_duration(step, "--step")
        if url:
            if source:
                raise UserError("give either SOURCE files or --url, not both")
            if t0 is None or t1 is None:
                raise UserError("--url needs --start and --end")
            if t1 < t0:
                raise UserError("--end is before --start")
            step_s = step_s or 15.0
            _run(app, _report_exporter_version(lambda: prometheus.fetch(url, t0, t1, step_s, progress=_progress(quiet)),
                                               exporter_version), cluster,
                 not no_synthetic_runs, as_json, quiet, tenants=parse_tenants(tenant))
            return
        if not source:
            raise UserError("give SOURCE files/directories/archives, or --url")
        span = (t0, t1 + step_s if (t1 is not None and step_s) else t1) if (t0 is not None or t1 is not None) else None
        at_s = parse_time(at, "--at")
        _run(app, _report_exporter_version(lambda: prometheus.read(list(source), default_ts=at_s), exporter_version),
             cluster, not no_synthetic_runs, as_json, quiet, span=span, cadence=step_s, tenants=parse_tenants(tenant))

    def _capture_cmd(name: str, read, helptext: str):  # noqa: ANN001, ANN202
        @import_group.command(name, help=helptext)
        @click.argument("source", type=click.Path())
        @_timing
        @_common
        @pass_app
        def cmd(app: AppContext, source: str, start: str | None, interval: str | None, node: str | None,
                cluster: str, tenant: tuple[str, ...], no_synthetic_runs: bool, as_json: bool, quiet: bool) -> None:
            t0, iv = parse_time(start, "--start"), parse_duration(interval, "--interval")
            _run(app, lambda: read(source, start=t0, interval=iv, node=node), cluster,
                 not no_synthetic_runs, as_json, quiet, tenants=parse_tenants(tenant))

        return cmd

    _capture_cmd("dmon", columnar.read_dmon, """A `dcgmi dmon` capture (no timestamps: --start and --interval, or the
        start line `ipledger pathb-command --format dmon` writes; a restart is a capture_restarted gap).

        \b
        Example:
          ipledger import dmon dmon-gpu07.txt --start 2026-01-01T00:00:00Z --interval 1s --node gpu07
        """)
    _capture_cmd("amd-smi", columnar.read_amdsmi, """`amd-smi metric` / `amd-smi monitor` output, plain, --json or --csv.

        \b
        Example:
          ipledger import amd-smi monitor.csv --start 2026-01-01T00:00:00Z --interval 10s --node mi300-01
        """)
    _capture_cmd("nvidia-smi", nvidia_smi.read, """`nvidia-smi --query-gpu=... --format=csv` loops or `nvidia-smi -q -x`.

        \b
        Example:
          ipledger import nvidia-smi smi.csv --node gpu07
        """)

    @cli.command("pathb-command")
    @click.option("--format", "fmt", type=click.Choice(["dmon", "amd-smi", "prometheus", "nvidia-smi"]),
                  help="What to capture: dcgmi dmon, amd-smi monitor, a Prometheus export of dcgm-exporter, nvidia-smi.")
    @click.option("--exporter", type=click.Choice(["dcgm-exporter", "dcgmi", "amd-smi", "nvidia-smi"]),
                  help="The older name of --format (dcgmi = dmon, dcgm-exporter = prometheus).")
    @click.option("--nodes", default="1", show_default=True, metavar="N|NAME,NAME",
                  help="How many nodes (the command runs on each), or their names (one ssh line per node).")
    @click.option("--hours", default=24.0, show_default=True, help="Length of the capture.")
    @click.option("--interval", default="15s", show_default=True, help="Sampling interval.")
    @click.option("--prometheus-url", default="http://127.0.0.1:9090", show_default=True)
    def capture_recipe_command(fmt: str | None, exporter: str | None, nodes: str, hours: float, interval: str,
                      prometheus_url: str) -> None:
        """Print the exact commands that produce a capture set `ipledger analyze DIR` reads: one file per node,
        the node's name in the file name, a wall-clock start line at each (re)start (appended: restart-safe).

        \b
        Example:
          ipledger pathb-command --format dmon --nodes 8 --hours 24
          ipledger pathb-command --format amd-smi --nodes mi300-01,mi300-02
          ipledger pathb-command --format prometheus --hours 24
        """
        kind = fmt or {"dcgmi": "dmon", "dcgm-exporter": "prometheus"}.get(exporter or "", exporter)
        if kind is None:
            raise UserError("give --format dmon|amd-smi|prometheus|nvidia-smi")
        echo(capture_recipes(kind, hours, parse_duration(interval, "--interval") or 15.0, prometheus_url,
                                  parse_nodes(nodes)))


_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def parse_nodes(value: str) -> int | tuple[str, ...]:
    """``--nodes``: a count, or host names (letters, digits, . _ -: they are written into shell commands)."""
    v = value.strip()
    if v.isdecimal():
        if not 1 <= int(v) <= 100_000:
            raise UserError(f"--nodes: a count from 1, or host names: {value!r}")
        return int(v)
    names = tuple(n.strip() for n in v.split(",") if n.strip())
    bad = [n for n in names if not _NODE_NAME.fullmatch(n)]
    if not names or bad:
        raise UserError(f"--nodes: not a host name (letters, digits, '.', '_', '-'): {(bad or [value])[0]!r}")
    return names


def _anchor(node: str, iv: int) -> str:
    """The wall-clock start line a capture writes at each (re)start (docs/telemetry.md, "Capture sets")."""
    return f"date -u +\"# ipledger-start %Y-%m-%dT%H:%M:%SZ node={node} interval_ms={iv * 1000}\""


def _per_node(nodes: int | tuple[str, ...], line: Callable[[str], str], what: str) -> list[str]:
    """The capture line on every node: one ssh line per named node, else the line to run on each of N."""
    if isinstance(nodes, tuple):
        out = [f"# {what}: one ssh line per node (each runs in the background on its node)."]
        out += [f"ssh {n} '{line(n)}' &" for n in nodes]
        out += ["wait", "mkdir -p captures", *[f"scp {n}:ipledger-capture/* captures/" for n in nodes]]
        return out
    return [f"# {what}: run this on each of the {nodes} node{'s' if nodes != 1 else ''} "
            "(e.g. pdsh -w NODES '...'); it writes ipledger-capture/<tool>-<node>.<ext>.",
            "NODE=$(hostname -s)",
            line("$NODE"),
            "# then copy every node's ipledger-capture/ file into one directory, captures/"]


def capture_recipes(kind: str, hours: float, interval_s: float, url: str,
                   nodes: int | tuple[str, ...] = 1) -> str:
    secs = int(hours * 3600)
    iv = max(1, int(round(interval_s)))
    count = int(secs / iv)
    restart = ("# If a capture stops (reboot, ^C), run its line again: it appends a new start line, and the "
               "hole is reported as capture_restarted.")
    if kind == "prometheus":
        step = max(iv, int(-(-secs // 10_000)))   # stay within 11,000 points per series per call
        from ..importers.dcgm_fields import SPECS

        metrics = " ".join(s.names[0] for s in SPECS)
        # Only samples scraped within the step: Prometheus' lookback would otherwise paper over holes.
        query = f"$m and (time() - timestamp($m) < {step})"
        loop = [f"for m in {metrics}; do",
                f"  curl -fsS -G \"$PROM/api/v1/query_range\" --data-urlencode \"query={query}\" \\",
                f"       --data-urlencode start=$START --data-urlencode end=$END --data-urlencode step={step}s \\",
                "       -o \"dcgm-export/$m.json\"",
                "done"]
        if isinstance(nodes, tuple):   # one file per metric and node: the node's name in the file name
            sel = "{Hostname=\"$NODE\"}"
            loop = [f"for NODE in {' '.join(nodes)}; do", f"for m in {metrics}; do",
                    f"  curl -fsS -G \"$PROM/api/v1/query_range\" --data-urlencode \"query=$m{sel} and "
                    f"(time() - timestamp($m{sel}) < {step})\" \\",
                    f"       --data-urlencode start=$START --data-urlencode end=$END --data-urlencode step={step}s \\",
                    "       -o \"dcgm-export/$m-$NODE.json\"",
                    "done; done"]
        return "\n".join([
            "# dcgm-exporter via Prometheus: the last %g h as query_range JSON (every series names its node in "
            "its Hostname label)." % hours,
            f"PROM={url}",
            "END=$(date -u +%s); START=$((END - " + str(secs) + "))",
            "mkdir -p dcgm-export",
            *loop,
            "tar czf dcgm-export.tar.gz dcgm-export",
            "# then: ipledger analyze dcgm-export.tar.gz   (or: ipledger import prometheus dcgm-export.tar.gz "
            f"--start $START --end $END --step {step}s; live: ipledger analyze --url $PROM --start $START --end $END "
            f"--step {step}s)",
        ])
    if kind == "dmon":
        from ..importers.dcgm_fields import PATHB_FIELD_IDS

        fields = ",".join(str(f) for f in PATHB_FIELD_IDS)

        def line(node: str) -> str:
            return (f"mkdir -p ipledger-capture && {{ {_anchor(node, iv)}; dcgmi dmon -e {fields} -d {iv * 1000} "
                    f"-c {count}; }} >> ipledger-capture/dmon-{node}.txt")

        return "\n".join([
            "# dcgmi dmon: %g h at %d s, one file per node (needs nv-hostengine running on each)." % (hours, iv),
            *_per_node(nodes, line, "dcgmi dmon"), restart, "# then: ipledger analyze captures/"])
    if kind == "amd-smi":
        def line(node: str) -> str:
            # --violation (ROCm 6.3+): the violation columns (PVIOL, TVIOL, TVIOL_ACTIVE, PHOT_TVIOL, VR_TVIOL, HBM_TVIOL) -> reasons
            return (f"mkdir -p ipledger-capture && {{ {_anchor(node, iv)}; amd-smi monitor -p -t -u -m -v -e --violation "
                    f"--csv -w {iv} -i {count}; }} >> ipledger-capture/amdsmi-{node}.csv")

        return "\n".join([
            "# amd-smi monitor: %g h at %d s, CSV with the violation columns, one file per node." % (hours, iv),
            *_per_node(nodes, line, "amd-smi monitor"), restart, "# then: ipledger analyze captures/"])
    if kind != "nvidia-smi":
        raise UserError(f"unknown capture format {kind!r}")

    def line(node: str) -> str:
        return ("mkdir -p ipledger-capture && TZ=UTC timeout " + str(secs) + " nvidia-smi --query-gpu=timestamp,"
                "index,uuid,name,utilization.gpu,utilization.memory,power.draw,temperature.gpu,clocks.sm,clocks.mem,"
                f"memory.used,clocks_event_reasons.active --format=csv -l {iv} > ipledger-capture/nvsmi-{node}.csv")

    return "\n".join([
        "# nvidia-smi query loop: %g h at %d s, UTC timestamps, one file per node." % (hours, iv),
        *_per_node(nodes, line, "nvidia-smi"), "# then: ipledger analyze captures/"])
