"""A device several runs hold at once (Kubernetes time-slicing, MPS, HAMi): each run's share of the device's
seconds (docs/kubernetes.md, "Shared GPUs").

Rules, first that applies: ``declared`` (a share the scheduler states for the pod, e.g. HAMi's
``nvidia.com/gpucores``, as ``num/den``), ``measured`` (the pod's share of the device's per-process
utilisation, as ``num/den``), else ``equal`` (1 / the number of pods holding it). A device one run holds is not
shared (a MIG slice is its own device, billed through its profile: ``method.mig``).

:func:`scale_account` applies a share to a run's account of the device in integer nanohours: every bucket is
``floor(bucket × share)`` with the largest remainders topped up so the buckets still sum to the scaled paid
time, which is ``floor(paid × share)``. Over the runs sharing a device, the shares plus the unallocated
remainder (:func:`remainder_nanohours`) equal the device's paid time exactly. Pure; no I/O. The scalar rules
(:func:`share_of`, the scaling and adding of accounts) are the tenant's verifier's (:mod:`ledger.proofcheck`).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Mapping

from .. import proofcheck as plain
from ..proofcheck import share_of  # noqa: F401  (rule, share) from a device_bound payload, or None: alone
from .attribution import DeviceAccount

RULES = ("declared", "measured", "equal")


def _scale(n: int, share: Fraction) -> int:
    return n * share.numerator // share.denominator


def scale_account(acc: DeviceAccount, share: Fraction) -> DeviceAccount:
    """The run's share of its account of a device, in whole nanohours (buckets still sum to paid): the
    verifier's :func:`ledger.proofcheck.scale_account` on the same integers."""
    return replace(DeviceAccount.of_plain(plain.scale_account(acc.plain(), share)), timeline=acc.timeline)


def remainder_nanohours(device_paid_nanohours: int, shares: list[Fraction]) -> int:
    """What the sharing runs leave of the device's paid time (idle or rounding): paid − Σ floor(paid × share)."""
    return device_paid_nanohours - sum(_scale(device_paid_nanohours, s) for s in shares)


# --- Sharers that change (issue 32): a device-second is split among the pods holding it at that second. ---

def nanohours_at(t: float) -> int:
    """An instant on the nanohour grid (so that the nanohours of adjacent intervals add up exactly)."""
    return int(round(Fraction(t) * 1_000_000_000 / 3600))


def membership_intervals(holds: Mapping[str, tuple[float, float]]) -> list[tuple[float, float, tuple[str, ...]]]:
    """Each pod's hold ``[start, end)`` of one device -> the intervals of constant membership, in time order
    (only those some pod holds; members sorted)."""
    cuts = sorted({t for a, b in holds.values() if b > a for t in (a, b)})
    out = []
    for a, b in zip(cuts, cuts[1:]):
        members = tuple(sorted(p for p, (s, e) in holds.items() if s <= a and e >= b and e > s))
        if members:
            out.append((a, b, members))
    return out


def interval_shares(members: tuple[str, ...], declared: Mapping[str, Fraction] | None = None,
                    measured: Mapping[str, Fraction] | None = None) -> tuple[str, dict[str, Fraction]]:
    """The rule and each member's share over one interval: ``declared`` when every member has a declared share
    summing to at most 1, else ``measured`` likewise, else ``equal``. A lone member holds the whole device."""
    if len(members) == 1:
        return "whole", {members[0]: Fraction(1)}
    for rule, given in (("declared", declared), ("measured", measured)):
        if given and all(m in given for m in members):
            s = {m: Fraction(given[m]) for m in members}
            if all(0 < v <= 1 for v in s.values()) and sum(s.values()) <= 1:
                return rule, s
    return "equal", {m: Fraction(1, len(members)) for m in members}


def split_device(holds: Mapping[str, tuple[float, float]], declared: Mapping[str, Fraction] | None = None,
                 measured: Mapping[str, Fraction] | None = None) -> tuple[dict[str, int], int, int]:
    """(each pod's nanohours, the idle/rounding remainder, the device's paid nanohours over the time any pod held
    it). Per interval of constant membership, a pod gets ``floor(paid_k × share)``; the remainder is what is
    left, so ``Σ pods + remainder == paid`` exactly."""
    pods = {p: 0 for p in holds}
    paid = 0
    for a, b, members in membership_intervals(holds):
        p_k = nanohours_at(b) - nanohours_at(a)
        paid += p_k
        _rule, s = interval_shares(members, declared, measured)
        for m in members:
            pods[m] += _scale(p_k, s[m])
    return pods, paid - sum(pods.values()), paid


def share_segments(bounds: list[tuple[float, Mapping]]) -> list[tuple[float, tuple[str, Fraction] | None]]:
    """A run's ``device_bound`` facts for one device, (ts, payload) in ledger order -> (from ts, share or None
    when it holds the device alone) segments: each later fact restates the share from its ts on (the collector
    writes one whenever the pods holding the device change). Consecutive equal shares merge."""
    out: list[tuple[float, tuple[str, Fraction] | None]] = []
    for ts, payload in sorted(bounds, key=lambda x: x[0]):
        s = share_of(payload)
        if out and out[-1][1] == s:
            continue
        out.append((ts, s))
    return out


def sum_accounts(parts: list[DeviceAccount], fidelity: str) -> DeviceAccount:
    """The accounts of a device over adjacent parts of a window, added (integer nanohours; no timeline): the
    verifier's :func:`ledger.proofcheck.sum_accounts`."""
    return DeviceAccount.of_plain(plain.sum_accounts([p.plain() for p in parts], fidelity))
