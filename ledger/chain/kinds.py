"""The entry vocabulary: every kind of fact the ledger records (docs/ledger.md describes each payload).

A module of its own, with no imports, so the Slurm hooks can name kinds without loading ``ledger.chain.entries``
(dataclasses and friends stay off their fast path).
"""


class Kind:
    ALLOCATION_STARTED = "allocation_started"
    ALLOCATION_ENDED = "allocation_ended"
    ALLOCATION_SUSPENDED = "allocation_suspended"
    ALLOCATION_RESUMED = "allocation_resumed"
    ALLOCATION_REQUEUED = "allocation_requeued"
    DEVICE_BOUND = "device_bound"
    TELEMETRY_SUMMARY = "telemetry_summary"
    TELEMETRY_SEGMENT = "telemetry_segment"
    UNKNOWN_INTERVAL = "unknown_interval"
    PROGRESS = "progress"
    CONTRACT_VERSION = "contract_version"
    ADJUSTMENT = "adjustment"
    GAP_RESOLUTION = "gap_resolution"
    RECEIPT_ISSUED = "receipt_issued"
    FINDING_RECORDED = "finding_recorded"
    FINDING_CONFIRMED = "finding_confirmed"
    FINDING_DISMISSED = "finding_dismissed"
    HOOK_ERROR = "hook_error"
    TOOL_OUTPUT = "tool_output"  # a vendor tool's raw answer, as a hook saw it (parsed at ship time)
    EVIDENCE_REFUSED = "evidence_refused"   # written by the shipper: a spool line or file it would not chain
    RECEIPT_FAILED = "receipt_failed"  # written by the shipper: a run's automatic receipt could not be issued
    TREE_HEAD = "tree_head"  # a signed Merkle tree head (ipledger checkpoint; docs/proofs.md)
    STATEMENT_EXPORTED = "statement_exported"  # written by export monthly: the month's statement left the ledger
