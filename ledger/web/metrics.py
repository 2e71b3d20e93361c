"""`/metrics`: the ledger's health and figures as OpenMetrics, from a `prometheus_client` custom collector.

Cardinality is bounded: labels are tenant, cluster, cause and finding kind only (no job, device or node labels;
docs/web.md lists every family)."""

from __future__ import annotations

import os
import time

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from starlette.responses import Response

from ..spool import QUARANTINE_DIR, SHIPPED_DIR

FAMILIES = ("ipledger_ledger_head_seq", "ipledger_ledger_head_age_seconds", "ipledger_last_ship_timestamp_seconds",
            "ipledger_ship_lag_seconds", "ipledger_spool_backlog_files", "ipledger_spool_quarantined_files",
            "ipledger_unknown_seconds", "ipledger_paid_gpu_hours", "ipledger_delivered_gpu_hours",
            "ipledger_lost_gpu_hours", "ipledger_open_findings", "ipledger_receipts_issued")


def _files(path: str) -> int:
    try:
        return sum(1 for e in os.scandir(path) if e.is_file(follow_symlinks=False) and not e.name.startswith("."))
    except OSError:
        return 0


class LedgerCollector:
    """Reads the view's snapshot (without running the agents: issued receipts and recorded findings) on each
    scrape."""

    def __init__(self, view, now=time.time) -> None:  # noqa: ANN001
        self.view, self.now = view, now

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


def registry(view) -> CollectorRegistry:  # noqa: ANN001
    reg = CollectorRegistry(auto_describe=False)
    reg.register(LedgerCollector(view))
    return reg


def metrics_response(view, accept: str) -> Response:  # noqa: ANN001
    from prometheus_client import exposition

    encoder, content_type = exposition.choose_encoder(accept)
    return Response(encoder(registry(view)), media_type=content_type.split(";")[0],
                    headers={"Content-Type": content_type})
