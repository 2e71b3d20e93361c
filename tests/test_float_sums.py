"""Receipt figures must not depend on the interpreter's ``sum()``: Python 3.12 adds floats with compensation, 3.11
left to right, so a tenant verifying on 3.12 (or a site replaying after an upgrade) could get another last bit and,
at a rounding boundary, another receipt hash. Every float sum that feeds a receipt goes through
``proofcheck.in_order_sum``. These tests stand in a compensated ``sum()`` (what 3.12 has) for the builtin and check
the figures do not move; on inputs where the two sums differ they fail on code that calls ``sum()`` on floats.
"""

from __future__ import annotations

import builtins
import functools
import math
import operator

from ledger import proofcheck
from ledger.method import carbon

_builtin_sum = builtins.sum


def compensated_sum(values, start=0):  # noqa: ANN001, ANN201 - the builtin's signature
    """Python 3.12's behaviour for floats (an exactly rounded sum here, which differs from left to right on the
    inputs below as 3.12's does); integers and other types as the builtin."""
    items = list(values)
    if any(isinstance(v, float) for v in items) or isinstance(start, float):
        return math.fsum([start, *items])
    return _builtin_sum(items, start)


# ten 0.1s: left to right 0.9999999999999999, compensated 1.0
TENTHS = [0.1] * 10


def test_the_stand_in_really_differs_from_left_to_right_on_these_inputs():
    assert compensated_sum(TENTHS) != functools.reduce(operator.add, TENTHS, 0.0)
    assert proofcheck.in_order_sum(TENTHS) == functools.reduce(operator.add, TENTHS, 0.0)


def _figures(rows: str) -> tuple:
    table = carbon.parse_intensity(rows, zone="CAISO_NORTH", origin="moer.csv")
    pue = {h: 1.1 for h in range(10)}   # the shown PUE is the mean of an hourly PUE file's hours
    kwh = {h: 1.0 for h in range(10)}
    return table.hourly, carbon.carbon(kwh, table, pue).pue


def test_watttime_hourly_means_and_the_shown_pue_do_not_depend_on_sum(monkeypatch):
    """Ten 5-minute MOER points of 0.1 g/kWh in one hour: the hour's mean is their left-to-right sum over ten."""
    rows = "point_time,value,units\n" + "".join(f"2026-11-02T00:{5 * k:02d}:00Z,0.1,g_co2_per_kwh\n"
                                                  for k in range(10))
    plain = _figures(rows)
    assert next(iter(plain[0].values())) == functools.reduce(operator.add, TENTHS, 0.0) / 10
    monkeypatch.setattr(builtins, "sum", compensated_sum)
    assert _figures(rows) == plain


def test_seconds_of_does_not_depend_on_sum(monkeypatch):
    parts = [(0.0, 0.1)] * 10
    plain = proofcheck.seconds_of(parts)
    monkeypatch.setattr(builtins, "sum", compensated_sum)
    assert proofcheck.seconds_of(parts) == plain == functools.reduce(operator.add, [0.1] * 10, 0.0)
