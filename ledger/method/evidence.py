"""Who controls the evidence a receipt rests on, and what counts as the provider's failure (docs/method.md).

Pure tables and functions, no I/O beyond the package's own XID table. Every unknown interval, failure cause
and progress mark on a receipt names the party that controls the evidence it rests on (:data:`PARTIES`):

* ``provider`` -- the site: its node collector, its spool and shipper;
* ``scheduler`` -- Slurm: whether the prolog/epilog ran, NODE_FAIL, BOOT_FAIL, preemption;
* ``vendor_tool`` -- DCGM, NVML, amd-smi and the driver (what they measured, or failed to);
* ``job_user`` -- the job's own user: their marks, their exit status, their cancel, what they put in the
  run's drop place.

Policy reads it: time made unknown by something the job's user controls is never credited automatically
(:func:`user_controlled`; the contract's ``user_caused_unknown`` charges or holds it), and a provider failure
needs provider-side evidence (:func:`provider_failure`): the scheduler's NODE_FAIL/BOOT_FAIL, or an XID of a
class NVIDIA's catalogue attributes to hardware or the driver (``xids.toml``), seen to be raised during the
run by the node collector's samples -- never an application XID, never DCGM's bare count of "Critical XID
Errors" (it names no XID), and never the user's own end state.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from typing import Iterable, Mapping, Sequence

from .. import proofcheck as plain

PARTIES = ("provider", "scheduler", "vendor_tool", "job_user")
XID_CLASSES = ("hardware", "driver", "application")
PROVIDER_XID_CLASSES = frozenset({"hardware", "driver"})
PROVIDER_FAILURE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})

# Unknown-interval cause -> the party that controls the evidence it rests on. A cause not listed is the
# provider's (the site wrote it: its collector, importer or shipper).
CAUSE_CONTROLLED_BY: Mapping[str, str] = {
    # the job's own user: the run's drop place they write and the hook could not empty or read
    "drop_place_over_quota": "job_user",
    "drop_place_unclean": "job_user",
    "marks_refused": "job_user",
    # the scheduler: whether the hooks ran at all
    "epilog_missing": "scheduler",
    "prolog_missing": "scheduler",
    # the vendor tools: DCGM's job record and its answers, amd-smi's counters, the device's identity
    "dcgm_host_engine_restart": "vendor_tool",
    "dcgm_watch_not_started": "vendor_tool",
    "dcgm_no_data": "vendor_tool",
    "dcgm_timeout": "vendor_tool",
    "dcgm_unreachable": "vendor_tool",
    "dcgm_unparsed": "vendor_tool",
    "dcgm_error": "vendor_tool",
    "dcgm_device_missing": "vendor_tool",
    "dcgm_watch_late": "vendor_tool",
    "dcgm_stopped_early": "vendor_tool",
    "amdsmi_timeout": "vendor_tool",
    "amdsmi_error": "vendor_tool",
    "amdsmi_no_baseline": "vendor_tool",
    "amdsmi_no_data": "vendor_tool",
    "device_uuid_unknown": "vendor_tool",
    # the site: its collector, its importer, its shipper's refusals
    "collector_down": "provider",
    "source_error": "provider",
    "counter_reset": "provider",
    "evidence_refused": "provider",
}

# Causes that rest only on DCGM's per-job record (``dcgmi stats``): a device the node collector's sealed
# samples cover in the window is measured by the samples instead (independent evidence wins), and the interval
# says which evidence was missing. Anyone who can reach the host engine can remove that record.
DCGM_JOB_RECORD_CAUSES = frozenset(c for c in CAUSE_CONTROLLED_BY if c.startswith("dcgm_"))
REPLACED_BY_SAMPLES = "node_collector_samples"


def rests_on_dcgm_job_record(cause: str | None, source: str | None) -> bool:
    """An interval the hooks derived from DCGM's job record (``dcgmi stats``): a DCGM cause recorded by a hook
    or derived at ship time from a hook's tool output -- not a collector's own gap."""
    src = str(source or "")
    return cause in DCGM_JOB_RECORD_CAUSES and (src == "ipledger.derive" or src.startswith("hook"))

# A run's end state -> who controls it. The user's own end (FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY ...)
# is theirs: any state not listed.
END_STATE_CONTROLLED_BY: Mapping[str, str] = {"NODE_FAIL": "scheduler", "BOOT_FAIL": "scheduler",
                                              "PREEMPTED": "scheduler"}
MARKS_CONTROLLED_BY = "job_user"


class XidTableError(ValueError):
    """A bad row of the XID table (one line naming the file and the field)."""


def controlled_by(cause: str | None) -> str:
    """The party that controls the evidence of an unknown interval with this cause."""
    return CAUSE_CONTROLLED_BY.get(str(cause), "provider")


def user_controlled(cause: str | None) -> bool:
    return controlled_by(cause) == "job_user"


def end_state_controlled_by(state: str | None) -> str:
    return END_STATE_CONTROLLED_BY.get(str(state), "job_user")


def parse_xid_table(data: Mapping, origin: str) -> dict[int, dict]:
    """``{xid: {"text", "class", "source"}}`` from the TOML table's content."""
    out = {}
    for key, row in data.items():
        where = f"{origin}: [{key}]"
        if not (isinstance(key, str) and key.isdecimal() and len(key) <= 4):
            raise XidTableError(f"{where}: the table name must be the XID number")
        if not isinstance(row, Mapping):
            raise XidTableError(f"{where} must be a table")
        cls = row.get("class")
        if cls not in XID_CLASSES:
            raise XidTableError(f"{where}.class must be one of {', '.join(XID_CLASSES)}, got {cls!r}")
        for f in ("text", "source"):
            if not isinstance(row.get(f), str) or not row[f].strip():
                raise XidTableError(f"{where}.{f} is required (a string)")
        out[int(key)] = {"text": row["text"], "class": cls, "source": row["source"]}
    return out


@lru_cache(maxsize=1)
def xid_table() -> dict[int, dict]:
    from .packaged import package_text

    text = package_text("ledger.method", "xids.toml")
    return parse_xid_table(tomllib.loads(text), "ledger/method/xids.toml")


def xid_class(code: int) -> str:
    """``hardware``, ``driver``, ``application`` or ``unclassified`` (a code the table does not hold)."""
    row = xid_table().get(int(code))
    return row["class"] if row else "unclassified"


def provider_xids() -> frozenset[int]:
    """The XIDs whose class is provider-side evidence of a failure."""
    return frozenset(x for x, r in xid_table().items() if r["class"] in PROVIDER_XID_CLASSES)


def xids_raised(samples: Iterable[tuple[float, float | None]]) -> list[tuple[float, int]]:
    """The XIDs a device's samples show raised during the window: ``[(t, code)]``, earliest first, one per code.

    A sample's XID (DCGM field 230, the device's last XID) is the value of a gauge that keeps its last code, so
    a code counts only where an earlier sample in the window held a different value (a code still shown from
    before the run is not this run's); not-measured values (None/NaN) are skipped. ``t`` is the first sample
    showing the code after a different one. Order-free: the same answer for the samples in any order.
    """
    seen = sorted((float(t), int(x)) for t, x in samples if x is not None and x == x and t == t)
    out: dict[int, float] = {}
    for code in sorted({x for _t, x in seen if x > 0}):
        other = [t for t, x in seen if x != code]
        if not other:
            continue
        first_other = other[0]
        later = [t for t, x in seen if x == code and t > first_other]
        if later:
            out[code] = later[0]
    return sorted(((t, code) for code, t in out.items()), key=lambda p: (p[0], p[1]))


@lru_cache(maxsize=1)
def xid_classes() -> Mapping[int, str]:
    """XID -> its class, from the package's table (what the verifier's functions take)."""
    return {x: r["class"] for x, r in xid_table().items()}


def provider_failure(state: str | None, xids: Sequence[tuple[str, float, int]]) -> str | None:
    """The provider's failure that ended a run (the state, or ``xid``), or None: the verifier's
    :func:`ledger.proofcheck.provider_failure` under this package's XID table.

    ``xids``: (device, t, code) raised on the run's devices during its window (:func:`xids_raised`).
    """
    return plain.provider_failure(state, xids, xid_classes())


def failure_evidence(state: str | None, xids: Sequence[tuple[str, float, int]],
                     dcgm_xid_count: int | None) -> list[dict]:
    """What the provider-failure answer rests on, each piece with the party that controls it (the verifier's
    :func:`ledger.proofcheck.failure_evidence` under this package's XID table)."""
    return plain.failure_evidence(state, xids, dcgm_xid_count, xid_classes())


def dcgm_xid_count(summary_payloads: Iterable[Mapping]) -> int:
    """DCGM's "Critical XID Errors" over a run's job summaries, where the hooks' derived summaries hold it:
    under ``values`` (``ledger.capture.sources.dcgm.summary_fields``)."""
    total = 0
    for p in summary_payloads:
        values = p.get("values")
        v = values.get("xid_errors") if isinstance(values, Mapping) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v > 0:
            total += int(v)
    return total
