"""A device several runs hold at once (Kubernetes time-slicing, MPS, HAMi): each run's share of the device's
seconds (docs/kubernetes.md, "Shared GPUs").

Rules, first that applies: ``declared`` (a share the scheduler states for the pod, e.g. HAMi's
``nvidia.com/gpucores``, as ``num/den``), ``measured`` (the pod's share of the device's per-process
utilisation, as ``num/den``), else ``equal`` (1 / the number of pods holding it). A device one run holds is not
shared (a MIG slice is its own device, billed through its profile: ``method.mig``).

:func:`scale_account` applies a share to a run's account of the device in integer nanohours: every bucket is
``floor(bucket × share)`` with the largest remainders topped up so the buckets still sum to the scaled paid
time, which is ``floor(paid × share)``. Over the runs sharing a device, the shares plus the unallocated
remainder (:func:`remainder_nh`) equal the device's paid time exactly. Pure; no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Mapping

import numpy as np

from .attribution import DeviceAccount

RULES = ("declared", "measured", "equal")


def _fraction(text: object) -> Fraction | None:
    if not isinstance(text, str):
        return None
    try:
        f = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return f if 0 < f <= 1 else None


def share_of(bound: Mapping) -> tuple[str, Fraction] | None:
    """(rule, share) from a ``device_bound`` payload, or None when the run holds the device alone."""
    sharers = bound.get("sharers")
    if not isinstance(sharers, int) or isinstance(sharers, bool) or sharers < 2:
        return None
    for rule in ("declared", "measured"):
        f = _fraction(bound.get(f"{rule}_share"))
        if f is not None:
            return rule, f
    return "equal", Fraction(1, sharers)


def _scale(n: int, share: Fraction) -> int:
    return n * share.numerator // share.denominator


def scale_account(acc: DeviceAccount, share: Fraction) -> DeviceAccount:
    """The run's share of its account of a device, in whole nanohours (buckets still sum to paid)."""
    paid = _scale(acc.paid_nh, share)
    raw = [int(b) * share.numerator for b in acc.buckets]
    floors = [r // share.denominator for r in raw]
    left = paid - sum(floors)
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] % share.denominator), i))
    for i in order[:max(left, 0)]:
        floors[i] += 1
    buckets = np.array(floors, dtype=np.int64)
    gap_nh = {g: _scale(v, share) for g, v in acc.gap_nh.items()}
    causes = {c: _scale(v, share) for c, v in acc.unknown_causes.items()}
    return replace(acc, paid_nh=paid, buckets=buckets, suspended_nh=_scale(acc.suspended_nh, share),
                   gap_nh=gap_nh, unknown_causes=causes, coarse_nh=_scale(acc.coarse_nh, share))


def remainder_nh(device_paid_nh: int, shares: list[Fraction]) -> int:
    """What the sharing runs leave of the device's paid time (idle or rounding): paid − Σ floor(paid × share)."""
    return device_paid_nh - sum(_scale(device_paid_nh, s) for s in shares)
