"""`/metrics`: the ledger's health and figures as OpenMetrics, from a `prometheus_client` custom collector.

Cardinality is bounded: labels are tenant, cluster, cause and finding kind only (no job, device or node labels;
docs/web.md lists every family)."""

from __future__ import annotations

import math
import os
import time

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from starlette.responses import Response

from ..capture.spool import QUARANTINE_DIR, SHIPPED_DIR
from ..chain.verify_status import VerifyStatusError, read as read_verify_status

FAMILIES = ("ipledger_ledger_head_seq", "ipledger_ledger_head_age_seconds", "ipledger_last_ship_timestamp_seconds",
            "ipledger_ship_lag_seconds", "ipledger_spool_backlog_files", "ipledger_spool_quarantined_files",
            "ipledger_unknown_seconds", "ipledger_paid_gpu_hours", "ipledger_delivered_gpu_hours",
            "ipledger_lost_gpu_hours", "ipledger_open_findings", "ipledger_receipts_issued", "ipledger_verify_ok",
            "ipledger_verify_age_seconds", "ipledger_verify_head_seq")


def _files(path: str) -> int:
    try:
        return sum(1 for e in os.scandir(path) if e.is_file(follow_symlinks=False) and not e.name.startswith("."))
    except OSError:
        return 0


def verify_status_setting(extra: dict, where: str = "config") -> str | None:
    """`[serve] verify_status`: the file `ipledger verify --record` writes (None: not configured)."""
    serve = extra.get("serve", {})
    v = serve.get("verify_status") if isinstance(serve, dict) else None
    if v is not None and (not isinstance(v, str) or not v.strip()):
        raise VerifyStatusError(f"{where}: serve.verify_status must be a file path, got {v!r}")
    return v


class LedgerCollector:
    """Reads the view's snapshot (without running the agents: issued receipts and recorded findings) and the last
    recorded verify (``verify_status``: its file, or None) on each scrape."""

    def __init__(self, view, verify_status: str | None = None, now=time.time) -> None:  # noqa: ANN001
        self.view, self.verify_status, self.now = view, verify_status, now

    def describe(self):  # noqa: ANN201 - no scrape at registration
        return []

    def collect(self):  # noqa: ANN201
        snap = self.view.snapshot(with_agents=False)
        now = self.now()
        g = GaugeMetricFamily
        yield g("ipledger_ledger_head_seq", "Sequence number of the ledger's newest entry.", value=snap.seq)
        age = now - snap.last_ts if snap.last_ts else 0.0
        yield g("ipledger_ledger_head_age_seconds", "Seconds since the newest entry's time.", value=age)
        yield g("ipledger_last_ship_timestamp_seconds", "Time of the newest entry shipped into the ledger.",
                value=snap.last_ts or 0.0)
        yield g("ipledger_ship_lag_seconds", "Seconds since the last shipped entry (now - last ship).", value=age)
        spool = getattr(getattr(self.view, "site", None), "spool", None) or ""
        backlog = _files(spool) if spool else 0
        quarantined = _files(os.path.join(spool, QUARANTINE_DIR)) if spool else 0
        yield g("ipledger_spool_backlog_files", "Spool files waiting to be shipped.", value=backlog)
        yield g("ipledger_spool_quarantined_files", "Spool files set aside in quarantine/.", value=quarantined)
        unknown = g("ipledger_unknown_seconds", "GPU-seconds of unknown telemetry in issued receipts, by cause.",
                    labels=["cause"])
        by_cause: dict[str, float] = {}
        hours: dict[tuple[str, str], list[float]] = {}
        for b in snap.receipts.values():
            for cause, h in (b.get("unknown_by_cause") or {}).items():
                by_cause[cause] = by_cause.get(cause, 0.0) + float(h) * 3600.0
            j, gh = b.get("job", {}), b.get("gpu_hours", {})
            k = (str(j.get("account")), str(j.get("cluster")))
            acc = hours.setdefault(k, [0.0, 0.0])
            acc[0] += float(gh.get("paid", 0.0))
            acc[1] += float(gh.get("delivered", 0.0))
        for cause in sorted(by_cause):
            unknown.add_metric([cause], by_cause[cause])
        yield unknown
        fams = {n: g(f"ipledger_{n}_gpu_hours", f"{n.capitalize()} GPU-hours of the issued receipts.",
                     labels=["tenant", "cluster"]) for n in ("paid", "delivered", "lost")}
        for (t, c), (p, d) in sorted(hours.items()):
            fams["paid"].add_metric([t, c], p)
            fams["delivered"].add_metric([t, c], d)
            fams["lost"].add_metric([t, c], p - d)
        yield from fams.values()
        openf = g("ipledger_open_findings", "Recorded findings with no operator verdict, by kind.", labels=["kind"])
        kinds: dict[str, int] = {}
        for f in snap.recorded:
            if f["status"]["status"] == "open":
                kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
        for k in sorted(kinds):
            openf.add_metric([k], kinds[k])
        yield openf
        yield g("ipledger_receipts_issued", "Runs with an issued receipt.", value=len(snap.receipts))
        yield from self._verify(now)

    def _verify(self, now: float):  # noqa: ANN202
        """ok 1 only for a recorded verify that passed; with none recorded (or an unreadable file) ok is 0 and the
        age +Inf, so an alert on either fires."""
        st = None
        if self.verify_status:
            try:
                st = read_verify_status(self.verify_status)
            except VerifyStatusError as exc:
                log = getattr(self.view, "log", None)
                if log is not None:
                    log(f"ipledger serve: /metrics: {exc}")
        g = GaugeMetricFamily
        yield g("ipledger_verify_ok", "1 when the last recorded `ipledger verify` passed, else 0.",
                value=1.0 if st is not None and st.ok else 0.0)
        yield g("ipledger_verify_age_seconds", "Seconds since the last recorded `ipledger verify` finished "
                "(+Inf: none recorded).", value=max(now - st.finished_at, 0.0) if st is not None else math.inf)
        yield g("ipledger_verify_head_seq", "Sequence number the last recorded verify reached: the head it checked, "
                "or where a failed walk stopped (-1: none recorded).", value=st.head_seq if st is not None else -1)


def registry(view, verify_status: str | None = None) -> CollectorRegistry:  # noqa: ANN001
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LedgerCollector(view, verify_status))
    return reg


def metrics_response(view, accept: str, verify_status: str | None = None) -> Response:  # noqa: ANN001
    from prometheus_client import exposition

    encoder, content_type = exposition.choose_encoder(accept)
    return Response(encoder(registry(view, verify_status)), media_type=content_type.split(";")[0],
                    headers={"Content-Type": content_type})
