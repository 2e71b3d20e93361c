"""MIG: what fraction of its parent GPU a MIG instance holds, for billing (docs/telemetry.md, "MIG accounting").

A MIG instance is its own device (parent UUID + GPU instance id). It is billed as the fraction of the parent that
its profile's compute slices hold: ``Ng`` of the parent's slices. The slice count per product is below, each
with its public source; a contract may instead price a profile directly (``[skus."A100-SXM4-80GB/3g.40gb"]``).
The parent itself is never bound to a run while it is partitioned (importers.pipeline.billable_devices).
"""

from __future__ import annotations

import re
from fractions import Fraction

# product name fragment -> compute slices of the whole GPU, with the source of the figure
MIG_SLICES: tuple[tuple[str, int, str], ...] = (
    ("A30", 4, "NVIDIA MIG User Guide, 'Supported MIG Profiles', A30 24GB: 1g.6gb .. 4g.24gb (4 compute slices)"),
    ("A100", 7, "NVIDIA MIG User Guide, 'Supported MIG Profiles', A100 40GB/80GB: 1g .. 7g (7 compute slices)"),
    ("H100", 7, "NVIDIA MIG User Guide, 'Supported MIG Profiles', H100 80GB/94GB: 1g .. 7g (7 compute slices)"),
    ("H200", 7, "NVIDIA MIG User Guide, 'Supported MIG Profiles', H200 141GB: 1g .. 7g (7 compute slices)"),
    ("B200", 7, "NVIDIA MIG User Guide, 'Supported MIG Profiles', B200 180GB: 1g .. 7g (7 compute slices)"),
)
_PROFILE = re.compile(r"^(\d)g\.\d+gb(\+me)?$")


def slices_of(sku: str | None) -> int | None:
    """The compute slices of a whole GPU of this product, None when the product is not in the table."""
    if not sku:
        return None
    up = sku.upper()
    return next((n for key, n, _src in MIG_SLICES if key in up), None)


def mig_share(profile: str | None, sku: str | None) -> Fraction | None:
    """``3g.40gb`` on an A100 -> 3/7; None when the profile or the product is not understood."""
    m = _PROFILE.match((profile or "").strip().lower())
    total = slices_of(sku)
    if m is None or total is None or not 0 < int(m.group(1)) <= total:
        return None
    return Fraction(int(m.group(1)), total)
