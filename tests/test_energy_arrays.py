"""The energy speed trick (ledger/method/energy_arrays.py) against the plain method (ledger/method/energy.py):
for counters rising in time and count, the column form gives the reference's spans, kWh, source, unknown
time, bucket split, hourly split and receipt blocks to the bit; any other counter takes the reference path."""

from __future__ import annotations

import functools
import json
import math
import operator
import sys
from decimal import Decimal

import numpy as np

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.chain.contracts import parse_contract
from ledger.method.carbon import constant_intensity, hourly_kwh
from ledger.method.energy import CounterReading, DeviceEnergy, EnergySpan, PowerSample, by_bucket, device_energy
from ledger.method.energy_arrays import (SpanArrays, array_in_order_sum, bucket_energy, by_time,
                                         energy_by_hour)
from ledger.proofcheck import in_order_sum
from ledger.receipts.energy import DeviceEnergyInput, carbon_block, energy_block
from ledger.telemetry.energy import device_energy_of

T0 = 1_767_225_600.0 + 1234.5
BASIS = parse_contract({"id": "c", "version": "1", "skus": {"default": {
    "rate_per_gpu_hour": "2.00", "energy_price_per_kwh": "0.25", "pue": 1.2, "energy_basis": "measured"}}},
    "c.toml").basis_for(None)


@st.composite
def devices(draw, clean: bool):  # noqa: ANN001, ANN201
    n = draw(st.integers(2, 120))
    steps = draw(st.lists(st.floats(0.5, 900.0), min_size=n, max_size=n))
    t = [T0 + draw(st.floats(0, 400))]
    for s in steps[1:]:
        t.append(t[-1] + s)
    watts = draw(st.lists(st.floats(1.0, 900.0), min_size=n, max_size=n))
    count = [draw(st.floats(0, 1e9))]
    for k in range(1, n):
        count.append(count[-1] + watts[k] * steps[k] + draw(st.floats(1e-3, 5.0)))
    if not clean:   # a reset, a repeated reading or a frozen stretch somewhere
        k = draw(st.integers(1, n - 1))
        kind = draw(st.sampled_from(["reset", "repeat", "frozen"]))
        if kind == "reset":
            count[k:] = [c - count[k] + 10.0 for c in count[k:]]
        elif kind == "repeat":
            count[k] = count[k - 1]
        else:
            t[k] = t[k - 1]
    drop = draw(st.sets(st.integers(0, n - 1), max_size=n // 3))
    power = [(x, w) for i, (x, w) in enumerate(zip(t, watts)) if i not in drop]
    nan_at = draw(st.sets(st.integers(0, n - 1), max_size=3))
    ev = [math.nan if i in nan_at else c for i, c in enumerate(count)]
    lo = T0 + draw(st.floats(-600, 600))
    hi = t[-1] + draw(st.floats(-300, 900))
    return t, ev, power, lo, max(hi, lo + 1.0)


def _buckets(lo: float, hi: float, cut: float, pause: float) -> tuple:
    a = lo + (hi - lo) * cut
    b = min(hi, a + pause)
    return ((lo, a, "paid"), (a, b, "suspended"), (b, hi, "paid"))


def _reference(t, ev, power, lo, hi) -> DeviceEnergy:  # noqa: ANN001
    rs = [CounterReading(x, c, 1.0) for x, c in zip(t, ev) if not math.isnan(c)]
    return device_energy("GPU", rs, lo, hi, [PowerSample(x, w) for x, w in power])


def _same(fast, ref: DeviceEnergy, buckets) -> None:  # noqa: ANN001
    assert fast.spans == ref.spans
    assert (fast.joules, fast.kwh, fast.source, fast.unknown_seconds, fast.has_spans) == (
        ref.joules, ref.kwh, ref.source, ref.unknown_seconds, ref.has_spans)
    assert bucket_energy(fast, buckets) == by_bucket(ref.spans, buckets)
    assert energy_by_hour(fast) == hourly_kwh(ref.spans)
    table = constant_intensity("DE", 321.0, "test")
    f_in = DeviceEnergyInput(fast, buckets, 700.0, Decimal("3.5"), BASIS)
    r_in = DeviceEnergyInput(ref, buckets, 700.0, Decimal("3.5"), BASIS)
    assert json.dumps([energy_block([f_in], "EUR"), carbon_block([(table, f_in)])], sort_keys=True) == \
        json.dumps([energy_block([r_in], "EUR"), carbon_block([(table, r_in)])], sort_keys=True)


def _columns(t, ev, power) -> dict:  # noqa: ANN001
    return {"energy_j": (tuple(t), tuple(ev)), "power_w": (tuple(x for x, _ in power), tuple(w for _, w in power))}


@settings(max_examples=200, deadline=None)
@given(devices(clean=True), st.floats(0, 1), st.floats(0, 20_000))
def test_rising_counters_take_the_column_path_and_equal_the_reference(dev, cut, pause) -> None:
    t, ev, power, lo, hi = dev
    fast = device_energy_of("GPU", _columns(t, ev, power), lo, hi)
    ref = _reference(t, ev, power, lo, hi)
    inside = [x for x, c in zip(t, ev) if lo <= x <= hi and not math.isnan(c)]
    assert isinstance(fast, SpanArrays) == (len(inside) >= 2)
    _same(fast, ref, _buckets(lo, hi, cut, pause))


@settings(max_examples=100, deadline=None)
@given(devices(clean=False), st.floats(0, 1), st.floats(0, 20_000))
def test_any_other_counter_takes_the_reference_path(dev, cut, pause) -> None:
    t, ev, power, lo, hi = dev
    fast = device_energy_of("GPU", _columns(t, ev, power), lo, hi)
    _same(fast, _reference(t, ev, power, lo, hi), _buckets(lo, hi, cut, pause))


# Floats of every size, so an addition's rounding depends on the order: any other order shows in the last bit.
FLOATS = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300) | \
    st.floats(-1e-3, 1e-3) | st.floats(0, 1e9)


@settings(max_examples=300, deadline=None)
@given(st.lists(FLOATS, max_size=300), FLOATS)
def test_the_array_sum_is_the_plain_in_order_sum_to_the_bit(values, start) -> None:
    array = np.array(values, dtype="float64")
    assert _bits(array_in_order_sum(array, start)) == _bits(in_order_sum(values, start))
    assert _bits(array_in_order_sum(array)) == _bits(in_order_sum(values))


# Joules of every size, so each hour's sum shows its order of additions in the last bit.
JOULES = st.floats(1e-3, 1e3) | st.floats(1e6, 1e15) | st.floats(1e-9, 1e-6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.5, 900.0) | st.floats(3000.0, 12_000.0), min_size=1, max_size=80),
       st.floats(0, 7200), st.data())
def test_hourly_energy_is_the_reference_to_the_bit_with_spans_across_hours(steps, offset, data) -> None:
    # spans of a few seconds beside spans running past one or several clock hours, a head span before the first
    # reading and a tail after the last (added first and last to their hours, as the reference adds them)
    t = [T0 + offset]
    for step in steps:
        t.append(t[-1] + step)
    joules = data.draw(st.lists(JOULES, min_size=len(steps), max_size=len(steps)))
    head = (EnergySpan(t[0] - data.draw(st.floats(1, 5000)), t[0], data.draw(JOULES), "power_integral",
                       "before_first_reading"),)
    tail = (EnergySpan(t[-1], t[-1] + data.draw(st.floats(1, 5000)), data.draw(JOULES), "power_integral",
                       "after_last_reading"),)
    arrays = SpanArrays("GPU", head, np.array(t[:-1]), np.array(t[1:]), np.array(joules), tail)
    got, want = energy_by_hour(arrays), hourly_kwh(arrays.spans)
    assert {k: _bits(v) for k, v in got.items()} == {k: _bits(v) for k, v in want.items()}


def test_spans_that_do_not_touch_in_order_take_the_reference_walk() -> None:
    # a span set not built by counter_arrays (a gap between spans, or out of order): the same figures all the same
    for start, end in (([0.0, 5000.0], [10.0, 9000.0]), ([4000.0, 0.0], [9000.0, 4000.0])):
        arrays = SpanArrays("GPU", (), T0 + np.array(start), T0 + np.array(end), np.array([3e6, 7e7]), ())
        assert energy_by_hour(arrays) == hourly_kwh(arrays.spans)


def _bits(x: float) -> str:
    return float(x).hex()


def test_an_order_the_sum_does_not_keep_shows() -> None:
    # the check above can fail: numpy's own np.sum (pairwise) and math.fsum differ from the in-order sum here
    values = [1e16, 1.0, 1.0, -1e16] * 40 + [3.0] * 200
    assert in_order_sum(values) == array_in_order_sum(np.array(values))
    assert in_order_sum(values) != math.fsum(values)
    assert in_order_sum(values) != float(np.sum(np.array(values)))


@settings(max_examples=200, deadline=None)
@given(st.lists(FLOATS, max_size=200), FLOATS)
def test_the_in_order_sum_is_what_python_3_11s_sum_gave(values, start) -> None:
    # receipts issued by sum() before the helper existed keep their figures: 3.11's sum() adds left to right,
    # as reduce does on every version (3.12's sum() compensates, so it is compared only where it is 3.11's)
    assert _bits(in_order_sum(values, start)) == _bits(functools.reduce(operator.add, values, start))
    assert _bits(in_order_sum(values)) == _bits(functools.reduce(operator.add, values, 0))
    if sys.version_info < (3, 12):
        assert _bits(in_order_sum(values, start)) == _bits(sum(values, start))
        assert _bits(in_order_sum(values)) == _bits(sum(values))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1.0, 2.0, 2.0, 3.0, math.nan, -1.0]) | st.floats(-10, 10), max_size=60))
def test_by_time_is_the_stable_sort(ts) -> None:
    t = np.array(ts, dtype="float64")
    tag = np.arange(len(t), dtype="float64")
    order = np.argsort(t, kind="stable")
    got_t, got_tag = by_time(t, tag)
    assert np.array_equal(got_t, t[order], equal_nan=True) and np.array_equal(got_tag, tag[order])


@st.composite
def interval_lists(draw, lo: float, hi: float):  # noqa: ANN001, ANN201
    """Bucket intervals in any order: overlapping, adjacent of one name, empty, reversed, outside the window."""
    out = []
    for _ in range(draw(st.integers(0, 25))):
        a = lo + (hi - lo) * draw(st.floats(-0.2, 1.2))
        b = a + (hi - lo) * draw(st.floats(-0.05, 0.6)) if draw(st.booleans()) else a
        out.append((a, b, draw(st.sampled_from(["paid", "suspended", "idle"]))))
    if out and draw(st.booleans()):   # one interval cut in two adjacent halves of the same name
        a, b, name = out[0]
        m = (a + b) / 2
        out[0:1] = [(a, m, name), (m, b, name)]
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(devices(clean=True), st.data())
def test_the_bucket_split_visits_only_overlapping_spans_and_equals_the_reference(dev, data) -> None:
    t, ev, power, lo, hi = dev
    fast = device_energy_of("GPU", _columns(t, ev, power), lo, hi)
    ref = _reference(t, ev, power, lo, hi)
    buckets = data.draw(interval_lists(lo, hi))
    got, want = bucket_energy(fast, buckets), by_bucket(ref.spans, buckets)
    assert {k: _bits(v) for k, v in got.kwh.items()} == {k: _bits(v) for k, v in want.kwh.items()}
    assert got == want
