"""The attribution method "ipledger-attribution" (docs/method.md): where every allocated GPU-second went.

Pure functions, no database: :mod:`ledger.method.attribution` turns one device's samples (numpy arrays),
its window, its unknown and suspended spans into integer nanohours per bucket; :func:`attribute_summary`
does the same from a DCGM job-stats summary alone; :mod:`ledger.method.evidence` says who controls each piece of
evidence and what counts as the provider's failure. Changing any formula, threshold or the SKU table changes
:data:`METHOD_VERSION`.

Public API::

    METHOD_NAME, METHOD_VERSION, BUCKETS, THROTTLE_REASONS, Thresholds
    attribute_device(window, samples=SampleArrays|None, unknown=[(a, b, gap_id)], suspended=[(a, b)],
                     rated_clock_mhz=..., thresholds=...) -> DeviceAccount
    attribute_summary(window, summary_payload, unknown=..., suspended=..., rated_clock_mhz=...) -> DeviceAccount
    reason_bucket(mask_array) -> int array of THROTTLE_REASONS indices
    skus.match_sku(name, table) / skus.site_table(config.extra)

May import: `ledger.proofcheck`.
"""

from __future__ import annotations

from .attribution import (  # noqa: F401
    BUCKETS,
    METHOD_NAME,
    METHOD_VERSION,
    NANOHOURS_PER_SECOND,
    THROTTLE_REASONS,
    DeviceAccount,
    SampleArrays,
    Thresholds,
    attribute_device,
    attribute_summary,
    nanohours_to_hours,
    reason_bucket,
    seconds_to_nanohours,
)
