"""Method 1.1's effective-compute lens (docs/method.md, "Effective compute").

* the vectorised lens equals the plain per-sample reference on random timelines (hypothesis), and reading it
  inside the attribution's pass changes no integer of the attribution (hypothesis);
* through the CLI, on a ledger with known pipe activities: ``receipt --json``'s tensor_gpu_hours is
  Σ c × tensor × r to 1e-9 h and unmeasured_gpu_hours the covered time of the samples without the field;
* the lens adds a block and changes no existing line: the 1.1 body minus the lens is the 1.0 body, and the
  1.0 text lines are all there;
* a receipt issued under 1.0.0 still verifies under 1.0.0 after the site turns 1.1.0 on, and one issued
  under 1.1.0 verifies too;
* the monthly statement's lens columns (JSON, CSV, FOCUS x_) are the sum of the issued receipts' lens.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.chain import db as db_mod
from ledger.chain import store
from ledger.chain.entries import Kind, make_entry
from ledger.method import SampleArrays
from ledger.method.lens import BOUNDS, lens_device, lens_device_reference, peak_tflops, precision_for
from ledger.method.skus import builtin_table
from ledger.telemetry.model import Sample
from ledger.telemetry.sealed import segment_entry, write_segment

T0 = 1_790_000_000.0  # 2026-09-21
maybe_frac = st.one_of(st.none(), st.floats(0, 1), st.sampled_from([0.0, 0.04, 0.3, 0.9]))


@st.composite
def device_timeline(draw):
    n = draw(st.integers(0, 40))
    cadence = draw(st.sampled_from([1.0, 10.0, 30.0]))
    ts = [T0 + i * cadence + draw(st.sampled_from([0.0, 0.0, 0.5, -0.5, 7.0])) for i in range(n)]
    m = len(ts)

    def col(strategy):
        return np.array([np.nan if x is None else x for x in (draw(strategy) for _ in range(m))], dtype=np.float64)

    arr = SampleArrays.from_columns(
        t=np.array(ts, dtype=np.float64), dt=col(st.sampled_from([cadence, cadence * 2, 0.0])),
        sm_active=col(maybe_frac), tensor_active=col(maybe_frac), gpu_util=col(maybe_frac),
        sm_clock=col(st.one_of(st.none(), st.floats(0, 3000))), procs=col(st.one_of(st.none(), st.integers(0, 2))),
        fb_used=col(st.one_of(st.none(), st.floats(0, 80000))), sm_occupancy=col(maybe_frac),
        dram_active=col(maybe_frac), fp64_active=col(maybe_frac), fp32_active=col(maybe_frac),
        fp16_active=col(maybe_frac), ops=col(st.one_of(st.none(), st.floats(0, 1e16))))
    end = T0 + draw(st.floats(0, 60 * cadence))
    span = st.tuples(st.floats(T0 - 60, end + 60), st.floats(0, 600))
    gaps = [(a, a + w, f"g{i}") for i, (a, w) in enumerate(draw(st.lists(span, max_size=3)))]
    susp = [(a, a + w) for a, w in draw(st.lists(span, max_size=2))]
    rated = draw(st.one_of(st.none(), st.sampled_from([1410.0, 1980.0])))
    return (T0 - draw(st.floats(0, 30)), end), arr, gaps, susp, rated


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(device_timeline())
def test_vectorised_lens_equals_the_per_sample_reference(tl):
    window, arr, gaps, susp, rated = tl
    a = lens_device(window, arr, unknown=gaps, suspended=susp, rated_clock_mhz=rated)
    b = lens_device_reference(window, arr, unknown=gaps, suspended=susp, rated_clock_mhz=rated)

    def close(x, y):  # the lens sums with numpy, the reference exactly: within a nanohour (3.6 µs)
        if x is None or y is None:
            return x is None and y is None
        return abs(x - y) <= 3.6e-6 + 1e-12 * abs(y)

    for f in ("tensor_s", "measured_s", "unmeasured_s", "delivered_s", "counted_s", "tensor_uncounted_s", "rated_s"):
        assert close(getattr(a, f), getattr(b, f)), f
    assert abs(a.counted_flop - b.counted_flop) <= 1e-9 * max(1.0, b.counted_flop)
    assert all(close(a.pipes_s[p], b.pipes_s[p]) for p in a.pipes_s)
    assert all(close(a.bound_s[k], b.bound_s[k]) for k in a.bound_s)
    # the split covers delivered time, and tensor time never exceeds the measured covered time
    assert abs(sum(a.bound_s.values()) - a.delivered_s) <= 1e-6 * max(1.0, a.delivered_s)
    assert a.tensor_s <= a.measured_s + 1e-9


# the shapes of a whole column that lens_device takes different ways: every value in [0, 1] (no clip), below
# pipe_high (no sample high), zeros (no sum), an out-of-range value (the clip), a NaN (unmeasured), none at all
COLUMN_SHAPES = ("in_unit", "below_high", "zeros", "out_of_range", "with_nan", "absent")


@st.composite
def shaped_column(draw, n):
    shape = draw(st.sampled_from(COLUMN_SHAPES))
    if shape == "absent":
        return None
    hi = {"in_unit": 1.0, "below_high": 0.29, "zeros": 0.0}.get(shape, 1.0)
    x = np.array([draw(st.floats(0, hi)) for _ in range(n)], dtype=np.float64)
    if n and shape == "out_of_range":
        for i in draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n)):
            x[i] = draw(st.sampled_from([-0.2, 1.3, np.inf, -np.inf]))
    if n and shape == "with_nan":
        x[draw(st.integers(0, n - 1))] = np.nan
    return x


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(device_timeline(), st.data())
def test_each_way_lens_device_takes_a_column_equals_the_reference(tl, data):
    """The shortcuts (no clip where a column lies in [0, 1], no sum of zeros, no highest-pipe test of a pipe
    never high) against the plain per-sample reference, each column drawn in one of the shapes."""
    window, arr, gaps, susp, rated = tl
    n = len(arr)
    ten = data.draw(shaped_column(n))
    arr = dataclasses.replace(arr, tensor=np.full(n, np.nan) if ten is None else ten,
                              **{p: data.draw(shaped_column(n)) for p in ("fp64", "fp32", "fp16")})
    kw = dict(unknown=gaps, suspended=susp, rated_clock_mhz=rated)
    a, b = lens_device(window, arr, **kw), lens_device_reference(window, arr, **kw)

    def close(x, y):
        if x is None or y is None:
            return x is None and y is None
        return abs(x - y) <= 3.6e-6 + 1e-12 * abs(y)

    for f in ("tensor_s", "measured_s", "unmeasured_s", "delivered_s", "tensor_uncounted_s", "rated_s"):
        assert close(getattr(a, f), getattr(b, f)), f
    assert all(close(a.pipes_s[p], b.pipes_s[p]) and close(a.pipes_uncounted_s[p], b.pipes_uncounted_s[p])
               for p in a.pipes_s)
    assert all(close(a.bound_s[k], b.bound_s[k]) for k in a.bound_s), (a.bound_s, b.bound_s)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(device_timeline())
def test_the_lens_read_in_the_attributions_pass_changes_no_integer_of_it(tl):
    """The receipt reads the lens inside the attribution's pass (its covered time, clock ratio and delivered
    seconds, before they are rounded in place): the account is attribute_device's, integer for integer, and
    the lens is the one lens_device gives on its own."""
    from ledger.method import attribute_device
    from ledger.method.attribution import attribute_device_covered
    from ledger.method.lens import lens_reader

    window, arr, gaps, susp, rated = tl
    kw = dict(unknown=gaps, suspended=susp, rated_clock_mhz=rated)
    plain = attribute_device(window, arr, **kw)
    acc, lens = attribute_device_covered(window, arr, use=lens_reader(arr), **kw)
    assert acc.paid_nanohours == plain.paid_nanohours and acc.buckets.tolist() == plain.buckets.tolist()
    assert acc.gap_nanohours == plain.gap_nanohours and acc.unknown_causes == plain.unknown_causes
    assert (acc.timeline is None) == (plain.timeline is None)
    if acc.timeline is not None:
        assert np.array_equal(acc.timeline, plain.timeline)
    alone = lens_device(window, arr, **kw)
    assert (lens is None and not len(arr)) or lens == alone


def test_peaks_and_precision():
    h100 = builtin_table()["H100-SXM5-80GB"]
    assert peak_tflops(h100, "bf16") == 989.4 and peak_tflops(h100, "fp8") == 1978.9
    assert peak_tflops(builtin_table()["A100-SXM4-80GB"], "fp8") is None  # no FP8 on Ampere: not invented
    assert precision_for({}, None, None) == "bf16"
    assert precision_for({"compute_precision": {"chem": "fp64", "default": "fp8"}}, "H100", "chem") == "fp64"
    assert precision_for({"compute_precision": {"chem": "fp64", "default": "fp8"}}, "H100", "bio") == "fp8"


def test_op_counters_give_achieved_flops_first_and_the_block_says_which():
    """AMD: the total FP16/32/64 op counters, where read, are the achieved FLOPs; without them, activity × peak."""
    from ledger.method.lens import lens_block

    n, dt = 30, 10.0
    t = T0 + dt * np.arange(n)
    mi300x = builtin_table()["MI300X"]
    counted = SampleArrays.from_columns(t=t, dt=np.full(n, dt), sm_active=np.full(n, 0.9),
                                        tensor_active=np.full(n, 0.5), sm_clock=np.full(n, 2100.0),
                                        ops=np.full(n, 4e15))  # 4e15 operations per 10 s: 400 TFLOPS
    x = lens_device((T0, T0 + n * dt), counted, rated_clock_mhz=2100.0)
    block = lens_block([(x, peak_tflops(mi300x, "bf16"), None)], "bf16")
    assert block["source"] == "op_counters"
    assert abs(block["achieved_pflop_hours"] - n * 4e15 / 1e15 / 3600) < 1e-9
    assert abs(block["rated_pflop_hours"] - n * dt / 3600 * 1.3074) < 1e-9
    inferred = SampleArrays.from_columns(t=t, dt=np.full(n, dt), sm_active=np.full(n, 0.9),
                                         tensor_active=np.full(n, 0.5), sm_clock=np.full(n, 2100.0))
    y = lens_device((T0, T0 + n * dt), inferred, rated_clock_mhz=2100.0)
    block = lens_block([(y, peak_tflops(mi300x, "bf16"), None)], "bf16")
    assert block["source"] == "tensor_active"
    assert abs(block["achieved_pflop_hours"] - n * dt * 0.5 / 3600 * 1.3074) < 1e-9
    assert lens_block([(x, 1307.4, None), (y, 1307.4, None)], "bf16")["source"] == "mixed"


# --- end to end through the CLI ----------------------------------------------------------------------------

CADENCE = 10.0
SKUS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
RATED = {SKUS[0]: 1980.0, SKUS[1]: 1410.0}


PIPE_FIELDS = ("fp64_active", "fp32_active", "fp16_active")


@st.composite
def fleets(draw, pipes: bool = False):
    """Devices with known per-sample pipe activity (None: the field was not measured on that sample); with
    ``pipes``, each row also has its FP64/FP32/FP16 pipe activities (a device may never measure them)."""
    devs = []
    for i in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 30))
        sku = draw(st.sampled_from(SKUS))
        no_tensor = draw(st.booleans())  # a device whose collector never had the profiling field
        no_pipes = not pipes or draw(st.booleans())   # ... or never the FP pipe fields (1006-1008)
        rows = []
        for _ in range(n):
            sm = draw(st.floats(0.1, 1.0))
            ten = None if no_tensor else draw(st.one_of(st.none(), st.floats(0, 1)))
            clock = draw(st.floats(300, 2100))
            row = (sm, ten, clock, draw(maybe_frac), draw(maybe_frac))
            if pipes:
                row += tuple(None if no_pipes else draw(maybe_frac) for _ in PIPE_FIELDS)
            rows.append(row)
        devs.append((f"GPU-lens-{i}", sku, rows))
    return devs


def _ledger(url, devs, job="9100", account="chem"):
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    key = dict(cluster="c1", job_id=job, run=0)
    n = max(len(r) for _u, _s, r in devs)
    es = [make_entry(Kind.ALLOCATION_STARTED, T0, {"account": account, "partition": "gpu", "qos": "normal"},
                     node="n1", **key)]
    es += [make_entry(Kind.DEVICE_BOUND, T0, {"index": i, "sku": sku}, device=u, node="n1", **key)
           for i, (u, sku, _r) in enumerate(devs)]
    store.append(eng, es)
    for u, _sku, rows in devs:
        samples = [Sample(device=u, t=T0 + k * CADENCE, dt=CADENCE, sm_active=sm, tensor_active=ten,
                          sm_clock_mhz=clk, sm_occupancy=occ, dram_active=dram, compute_procs=1.0,
                          **dict(zip(PIPE_FIELDS, pipes)))
                   for k, (sm, ten, clk, occ, dram, *pipes) in enumerate(rows)]
        write_segment(eng, samples, segment_entry(samples, node="n1", source="test"))
    store.append(eng, [make_entry(Kind.ALLOCATION_ENDED, T0 + n * CADENCE, {"exit_code": 0}, node="n1", **key)])
    eng.dispose()


def _config(tmp_path, version):
    cfg = tmp_path / f"site-{version}.toml"
    cfg.write_text(f'method_version = "{version}"\ncompute_precision = "bf16"\n')
    os.chmod(cfg, 0o600)
    return str(cfg)


def _json(runner, cli, *args):
    res = runner.invoke(cli, list(args))
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(fleets())
def test_receipt_lens_is_sum_of_covered_time_tensor_and_clock_ratio(tmp_path_factory, runner, cli, devs):
    tmp = tmp_path_factory.mktemp("lens")
    url = f"sqlite:///{tmp / 'l.db'}"
    _ledger(url, devs)
    body = _json(runner, cli, "--db", url, "--config", _config(tmp, "1.1.0"), "receipt", "9100", "--json")
    ec = body["effective_compute"]
    # The truth, computed here from what was written: every sample covers its full 10 s (regular cadence, the
    # window holds them all), r = min(clock / rated, 1).
    want_tensor = sum(CADENCE * ten * min(clk / RATED[sku], 1.0) for _u, sku, rows in devs
                      for _sm, ten, clk, _o, _d in rows if ten is not None) / 3600.0
    want_unmeasured = sum(CADENCE for _u, _s, rows in devs for r in rows if r[1] is None) / 3600.0
    assert abs(ec["tensor_gpu_hours"] - want_tensor) <= 1e-9 * max(1, len(devs))
    assert abs(ec["unmeasured_gpu_hours"] - want_unmeasured) <= 1e-9 * max(1, len(devs))
    assert ec["precision"] == "bf16" and ec["method"]["version"] == "1.1.0"
    assert ec["fp64_gpu_hours"] is None  # never measured here: unknown, not zero
    measured = [(sku, ten, clk) for _u, sku, rows in devs for _sm, ten, clk, _o, _d in rows if ten is not None]
    if measured:
        peak = {SKUS[0]: 989.4, SKUS[1]: 312.0}
        want_ach = sum(CADENCE * t * min(c / RATED[s], 1.0) * peak[s] / 1000 for s, t, c in measured) / 3600
        want_rated = sum(CADENCE * peak[s] / 1000 for s, _t, _c in measured) / 3600
        assert abs(ec["achieved_pflop_hours"] - want_ach) <= 1e-8
        assert abs(ec["rated_pflop_hours"] - want_rated) <= 1e-8
    split = [v for k, v in ec["bound_split"].items() if v is not None]
    assert not split or abs(sum(split) - 1.0) < 1e-5
    assert set(ec["bound_split"]) == {*BOUNDS, "unmeasured"}

    # 1.0.0: the same body without the lens; every 1.0 text line is in the 1.1 text unchanged but the method's
    old = _json(runner, cli, "--db", url, "receipt", "9100", "--json")
    assert old["receipt_version"] == "1.2" and old["method"]["version"] == "1.0.0"
    assert "effective_compute" not in old
    stripped = {k: v for k, v in body.items() if k not in ("effective_compute", "receipt_hash", "receipt_version")}
    stripped["method"] = {**stripped["method"], "version": "1.0.0"}
    assert stripped == {k: v for k, v in old.items() if k not in ("receipt_hash", "receipt_version")}
    text_old = runner.invoke(cli, ["--db", url, "receipt", "9100"]).output.splitlines()
    text_new = runner.invoke(cli, ["--db", url, "--config", _config(tmp, "1.1.0"), "receipt", "9100"]).output
    lines_new = text_new.splitlines()
    assert "Effective compute" in text_new
    for line in text_old:
        if line.startswith("method ") or line.startswith("receipt "):
            continue
        assert line in lines_new


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(fleets(pipes=True))
def test_receipt_pipe_hours_and_1_2_flops_are_sums_over_the_stored_pipes(tmp_path_factory, runner, cli, devs):
    """The FP pipes stored (sample block format 2): ``fp64/fp32/fp16_gpu_hours`` = Σ c × pipe × r over the
    samples that measured the pipe (null where no sample of any device did: unknown, not zero), and 1.2.0's
    achieved FLOPs add Σ c × pipe × r × the SKU's non-tensor peak (FP32, FP64) to 1.1.0's tensor figure; the
    time identity and every other lens figure are 1.1.0's."""
    tmp = tmp_path_factory.mktemp("pipes")
    url = f"sqlite:///{tmp / 'p.db'}"
    _ledger(url, devs)
    new = _json(runner, cli, "--db", url, "--config", _config(tmp, "1.2.0"), "receipt", "9100", "--json")
    old = _json(runner, cli, "--db", url, "--config", _config(tmp, "1.1.0"), "receipt", "9100", "--json")
    ec, ec11 = new["effective_compute"], old["effective_compute"]
    ratio = {s: (lambda clk, s=s: min(clk / RATED[s], 1.0)) for s in SKUS}
    for j, p in enumerate(("fp64", "fp32", "fp16")):
        vals = [(sku, row[5 + j], row[2]) for _u, sku, rows in devs for row in rows if row[5 + j] is not None]
        if not vals:
            assert ec[f"{p}_gpu_hours"] is None
            continue
        want = sum(CADENCE * v * ratio[s](clk) for s, v, clk in vals) / 3600.0
        assert abs(ec[f"{p}_gpu_hours"] - want) <= 1e-9 * len(devs), p
    # 1.2.0's achieved FLOPs: 1.1.0's plus each priced pipe at its non-tensor peak, on devices with tensor
    # activity measured somewhere (the rated time's devices)
    non_tensor = {SKUS[0]: {"fp32": 67.0, "fp64": 34.0}, SKUS[1]: {"fp32": 19.5, "fp64": 9.7}}
    extra = 0.0
    for _u, sku, rows in devs:
        if not any(r[1] is not None for r in rows):
            continue
        for row in rows:
            for j, p in ((0, "fp64"), (1, "fp32")):
                if row[5 + j] is not None:
                    extra += CADENCE * row[5 + j] * ratio[sku](row[2]) * non_tensor[sku][p] / 1000 / 3600
    if ec11["achieved_pflop_hours"] is None:
        assert ec["achieved_pflop_hours"] is None and ec["flops_source"] == "unmeasured"
    else:
        assert abs(ec["achieved_pflop_hours"] - (ec11["achieved_pflop_hours"] + extra)) <= 2e-8
        assert ec["flops_source"] == "activity"
    same = {k: v for k, v in ec.items() if k not in ("achieved_pflop_hours", "rated_share", "method",
                                                    "flops_source")}
    assert same == {k: v for k, v in ec11.items() if k not in ("achieved_pflop_hours", "rated_share", "method")}
    strip = ("effective_compute", "receipt_hash", "method")
    assert {k: v for k, v in new.items() if k not in strip} == {k: v for k, v in old.items() if k not in strip}


def _amd_ledger(url, devs, job="9200"):
    """MI300X runs as the store holds AMD samples: GFX activity as gpu_util, MFMA activity as tensor_active, and
    (where the source had them) the FP16+FP32+FP64 op counters' count over each sample as fp_ops."""
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    key = dict(cluster="c1", job_id=job, run=0)
    n = max(len(r) for _u, r in devs)
    es = [make_entry(Kind.ALLOCATION_STARTED, T0, {"account": "amd", "partition": "gpu", "qos": "normal"},
                     node="m1", **key)]
    es += [make_entry(Kind.DEVICE_BOUND, T0, {"index": i, "sku": "AMD Instinct MI300X"}, device=u, node="m1", **key)
           for i, (u, _r) in enumerate(devs)]
    store.append(eng, es)
    for u, rows in devs:
        samples = [Sample(device=u, t=T0 + k * CADENCE, dt=CADENCE, gpu_util=gfx, tensor_active=mfma,
                          sm_clock_mhz=clk, compute_procs=1.0, fp_ops=ops)
                   for k, (gfx, mfma, clk, ops) in enumerate(rows)]
        write_segment(eng, samples, segment_entry(samples, node="m1", source="amd-test", extra={"vendor": "amd"}))
    store.append(eng, [make_entry(Kind.ALLOCATION_ENDED, T0 + n * CADENCE, {"exit_code": 0}, node="m1", **key)])
    eng.dispose()


def test_amd_achieved_flops_come_from_the_op_counters_where_stored_and_the_receipt_says_which(tmp_path, runner,
                                                                                            cli):
    """Method 1.2.0 on MI300X samples: with the op counters stored, achieved FLOPs are the operations counted
    (flops_source "op_counters"); without, MFMA activity × clock ratio × the BF16 peak ("activity"); a run
    with one of each says "mixed". The time identity is 1.0.0's."""
    counted = [(0.9, 0.5, 2100.0, 4e15)] * 12                 # 4e15 operations per 10 s: 400 TFLOP/s
    inferred = [(0.9, 0.5, 1890.0, None)] * 12                # MFMA 50 % at 90 % of the rated clock
    cfg = _config(tmp_path, "1.2.0")
    got = {}
    for name, devs in (("counted", [("GPU-amd-c", counted)]), ("inferred", [("GPU-amd-i", inferred)]),
                       ("mixed", [("GPU-amd-c", counted), ("GPU-amd-i", inferred)])):
        url = f"sqlite:///{tmp_path / (name + '.db')}"
        _amd_ledger(url, devs)
        got[name] = _json(runner, cli, "--db", url, "--config", cfg, "receipt", "9200", "--json")
    ec = {k: v["effective_compute"] for k, v in got.items()}
    assert ec["counted"]["flops_source"] == "op_counters"
    assert abs(ec["counted"]["achieved_pflop_hours"] - 12 * 4e15 / 1e15 / 3600) <= 1e-9
    assert ec["inferred"]["flops_source"] == "activity"
    assert abs(ec["inferred"]["achieved_pflop_hours"] - 12 * CADENCE * 0.5 * 0.9 * 1307.4 / 1000 / 3600) <= 1e-9
    assert ec["mixed"]["flops_source"] == "mixed"
    assert abs(ec["mixed"]["achieved_pflop_hours"] - ec["counted"]["achieved_pflop_hours"]
               - ec["inferred"]["achieved_pflop_hours"]) <= 2e-9
    rated_one = 12 * CADENCE / 3600 * 1.3074
    assert abs(ec["counted"]["rated_pflop_hours"] - rated_one) <= 1e-9
    assert abs(ec["counted"]["rated_share"] - 400 / 1307.4) < 1e-6
    text = runner.invoke(cli, ["--db", f"sqlite:///{tmp_path / 'mixed.db'}", "--config", cfg, "receipt", "9200"])
    assert "achieved FLOPs from" in text.output and "mixed" in text.output
    plain = _json(runner, cli, "--db", f"sqlite:///{tmp_path / 'mixed.db'}", "receipt", "9200", "--json")
    assert plain["gpu_hours"] == got["mixed"]["gpu_hours"] and "effective_compute" not in plain   # 1.0.0's


def _issued_under_one_replays_after_the_other(runner, cli, url: str, cfg_old, cfg_new) -> None:  # noqa: ANN001
    """Job 9100 issued under ``cfg_old``'s method verifies under ``cfg_new``'s site; reissued under the new one, it
    verifies under the old site's too (each receipt replays under the method version it was issued with)."""
    assert runner.invoke(cli, ["--db", url, "--config", cfg_old, "receipt", "9100", "--issue"]).exit_code == 0
    v = _json(runner, cli, "--db", url, "--config", cfg_new, "receipt", "9100", "--verify", "--json")
    assert v["ok"] is True
    res = runner.invoke(cli, ["--db", url, "--config", cfg_new, "receipt", "9100", "--issue"])
    assert res.exit_code == 0 and "reissued" in res.output
    v = _json(runner, cli, "--db", url, "--config", cfg_old, "receipt", "9100", "--verify", "--json")
    assert v["ok"] is True


def test_issued_under_1_0_replays_under_1_0_and_1_1_under_1_1(tmp_path, runner, cli):
    url = f"sqlite:///{tmp_path / 'v.db'}"
    devs = [("GPU-v-0", SKUS[0], [(0.9, 0.6, 1800.0, 0.5, 0.2)] * 20)]
    _ledger(url, devs)
    cfg10, cfg11 = _config(tmp_path, "1.0.0"), _config(tmp_path, "1.1.0")
    # the site moves to 1.1.0: the receipt issued under 1.0.0 still replays byte-identically under 1.0.0
    _issued_under_one_replays_after_the_other(runner, cli, url, cfg10, cfg11)
    body = _json(runner, cli, "--db", url, "--config", cfg11, "receipt", "9100", "--json")
    assert body["receipt_version"] == "1.3" and body["effective_compute"]["rated_share"] is not None
    res = runner.invoke(cli, ["--db", url, "verify", "--json"])
    assert res.exit_code == 0, res.output
    # bulk issuing under the same site computes the same 1.1.0 receipt: nothing new to issue
    again = _json(runner, cli, "--db", url, "--config", cfg11, "issue", "--all", "--json")
    assert again["unchanged"] == 1 and again["issued"] == again["reissued"] == 0, again


def test_issued_under_1_1_replays_under_1_1_after_the_site_moves_to_1_2(tmp_path, runner, cli):
    """With FP pipes stored, 1.1.0 and 1.2.0 give different achieved FLOPs: a receipt issued under 1.1.0 still
    replays under 1.1.0 once the site runs 1.2.0, and one issued under 1.2.0 replays under 1.2.0."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    _ledger(url, [("GPU-r-0", SKUS[0], [(0.9, 0.1, 1800.0, 0.5, 0.2, 0.2, 0.7, 0.0)] * 20)])
    cfg11, cfg12 = _config(tmp_path, "1.1.0"), _config(tmp_path, "1.2.0")
    _issued_under_one_replays_after_the_other(runner, cli, url, cfg11, cfg12)
    b11 = _json(runner, cli, "--db", url, "--config", cfg11, "receipt", "9100", "--json")["effective_compute"]
    b12 = _json(runner, cli, "--db", url, "--config", cfg12, "receipt", "9100", "--json")["effective_compute"]
    assert b12["achieved_pflop_hours"] > b11["achieved_pflop_hours"] and b12["flops_source"] == "activity"
    res = runner.invoke(cli, ["--db", url, "verify", "--json"])
    assert res.exit_code == 0, res.output


def test_a_bad_precision_is_one_line_naming_the_setting(tmp_path, runner, cli):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('method_version = "1.1.0"\ncompute_precision = "fp4"\n')
    os.chmod(cfg, 0o600)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    _ledger(url, [("GPU-b-0", SKUS[0], [(0.9, 0.6, 1800.0, 0.5, 0.2)])])
    res = runner.invoke(cli, ["--db", url, "--config", str(cfg), "receipt", "9100"])
    assert res.exit_code != 0 and "compute_precision" in res.output and "Traceback" not in res.output


def test_bound_split_reads_occupancy_and_dram_from_the_stored_samples(tmp_path, runner, cli):
    """Memory-bound on one device, latency-bound on another, compute on a third: equal delivered time each."""
    url = f"sqlite:///{tmp_path / 'b.db'}"
    devs = [("GPU-m", SKUS[0], [(0.9, 0.1, 1980.0, 0.5, 0.6)] * 10),   # DRAM high, pipes low
            ("GPU-l", SKUS[0], [(0.9, 0.05, 1980.0, 0.1, 0.1)] * 10),  # SM busy, occupancy low
            ("GPU-c", SKUS[0], [(0.9, 0.8, 1980.0, 0.5, 0.6)] * 10)]   # tensor high wins over DRAM
    _ledger(url, devs)
    ec = _json(runner, cli, "--db", url, "--config", _config(tmp_path, "1.1.0"), "receipt", "9100",
               "--json")["effective_compute"]
    third = round(1 / 3, 6)
    assert ec["bound_split"] == {"compute": third, "memory": third, "latency": third, "other": 0.0,
                                 "unmeasured": 0.0}


def test_statements_of_1_1_receipts_still_export_and_pass_the_focus_validator(tmp_path, runner, cli):
    """Receipts issued under 1.1.0 go through the monthly export, and its FOCUS file (with the lens's x_ columns)
    passes the validator."""
    from tests.focus_validator import Unavailable, validate
    from tests.services import unavailable
    from tests.test_issue_cli import write_export

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    cfg = _config(tmp_path, "1.1.0")
    for args in (["init"], ["import", "prometheus", str(write_export(tmp_path / "export")), "--quiet"],
                 ["issue", "--all", "--quiet"],
                 ["export", "monthly", "--month", "2026-11", "--format", "focus", "--out",
                  str(tmp_path / "nov.focus.csv"), "--quiet"]):
        res = runner.invoke(cli, ["--db", url, "--config", cfg, *args])
        assert res.exit_code == 0, res.output
    nov = _json(runner, cli, "--db", url, "--config", cfg, "export", "monthly", "--month", "2026-11",
                "--format", "json", "--out", "-")
    assert nov["totals"]["paid"] > 0, nov["totals"]
    from ledger.chain import db as _db
    from ledger.chain.entries import Kind as _Kind
    from ledger.chain.rows import iter_entries

    eng = _db.make_engine(url)
    issued = [c.entry.data for c in iter_entries(eng, kinds=[_Kind.RECEIPT_ISSUED])]
    eng.dispose()
    assert issued and all(d["method"]["version"] == "1.1.0" and "effective_compute" in d["receipt"]
                          for d in issued)
    try:
        v = validate(tmp_path / "nov.focus.csv")
    except Unavailable as exc:
        unavailable(str(exc))
    assert v.failed == [], v.summary()


def test_statement_lens_columns_are_the_sum_of_the_receipts_lens(tmp_path, runner, cli):
    """Per tenant and class, in the JSON, the long CSV and FOCUS's x_ columns, each lens column is the sum of
    the issued receipts' effective_compute figures; a receipt issued under 1.0.0 adds its paid time to
    lens_unmeasured_gpu_hours and nothing else; the column reader and the lines agree with the dict path."""
    import csv

    from reports import issued_columns
    from reports.export import build_statement
    from reports.lens_columns import LENS_COLUMNS, LENS_FOCUS, LENS_METHOD_VERSIONS
    from ledger.method.lens import LENS_METHOD_VERSION
    from ledger.chain.rows import iter_entries

    assert LENS_METHOD_VERSION in LENS_METHOD_VERSIONS
    url = f"sqlite:///{tmp_path / 's.db'}"
    _ledger(url, [("GPU-s-0", SKUS[0], [(0.9, 0.6, 1800.0, 0.5, 0.2), (0.8, None, 1980.0, 0.1, 0.7)] * 9),
                  ("GPU-s-1", SKUS[1], [(0.7, 0.05, 1500.0, 0.1, 0.1)] * 14)], job="9100", account="chem")
    # (with the FP pipes stored: their hours reach the statement's fp columns and FOCUS's x_Fp*GpuHours)
    _ledger(url, [("GPU-s-2", SKUS[0], [(0.95, 0.9, 1980.0, 0.6, 0.2, 0.1, 0.5, 0.0)] * 11)], job="9101",
            account="astro")
    _ledger(url, [("GPU-s-3", SKUS[1], [(0.5, 0.5, 1200.0, 0.5, 0.5)] * 7)], job="9102", account="chem")
    cfg10, cfg11, cfg12 = _config(tmp_path, "1.0.0"), _config(tmp_path, "1.1.0"), _config(tmp_path, "1.2.0")
    for job, cfg in (("9100", cfg11), ("9101", cfg12), ("9102", cfg10)):
        assert runner.invoke(cli, ["--db", url, "--config", cfg, "receipt", job, "--issue"]).exit_code == 0
    eng = db_mod.make_engine(url)
    receipts = [c.entry.data["receipt"] for c in iter_entries(eng, kinds=[Kind.RECEIPT_ISSUED])]
    assert sorted(r["method"]["version"] for r in receipts) == ["1.0.0", "1.1.0", "1.2.0"]

    def want(rs):
        out = dict.fromkeys(LENS_COLUMNS, 0.0)
        for r in rs:
            ec = r.get("effective_compute")
            if ec is None:
                out["lens_unmeasured_gpu_hours"] += r["gpu_hours"]["paid"]
                continue
            for k in LENS_COLUMNS[:6]:
                out[k] += ec[k] or 0.0
            for b in BOUNDS[:4]:
                out[f"{b}_bound_gpu_hours"] += (ec["bound_split"][b] or 0.0) * r["gpu_hours"]["delivered"]
            out["lens_unmeasured_gpu_hours"] += ec["unmeasured_gpu_hours"]
        return out

    by_tenant = {t: want([r for r in receipts if r["job"]["account"] == t]) for t in ("chem", "astro")}
    assert by_tenant["astro"]["tensor_gpu_hours"] > 0 and by_tenant["chem"]["lens_unmeasured_gpu_hours"] > 0
    assert by_tenant["astro"]["fp32_gpu_hours"] > 0 and by_tenant["astro"]["fp64_gpu_hours"] > 0
    assert by_tenant["chem"]["fp32_gpu_hours"] == 0.0   # never measured there: the block says null

    def close(got, exp, tol=2e-6):
        assert abs(float(got) - exp) <= tol, (got, exp)

    nov = _json(runner, cli, "--db", url, "export", "monthly", "--month", "2026-09", "--format", "json",
                "--out", "-")
    for row in nov["tenants"]:
        for c in LENS_COLUMNS:
            close(row[c], by_tenant[row["tenant"]][c])
    close(nov["totals"]["tensor_gpu_hours"], sum(v["tensor_gpu_hours"] for v in by_tenant.values()))
    assert len(nov["classes"]) == 2  # one partition and QOS per tenant: a class per tenant
    for row in nov["classes"]:
        for c in LENS_COLUMNS:
            close(row[c], by_tenant[row["tenant"]][c])
    csv_path, focus_path, pq_path = tmp_path / "s.csv", tmp_path / "s.focus.csv", tmp_path / "s.parquet"
    for fmt, p in (("csv", csv_path), ("focus", focus_path), ("parquet", pq_path)):
        res = runner.invoke(cli, ["--db", url, "export", "monthly", "--month", "2026-09", "--format", fmt,
                                  "--out", str(p), "--quiet"])
        assert res.exit_code == 0, res.output
    tenant_rows = [r for r in csv.DictReader(csv_path.open()) if r["level"] == "tenant"]
    assert len(tenant_rows) == 2
    for row in tenant_rows:
        for c in LENS_COLUMNS:
            close(row[c], by_tenant[row["tenant"]][c])
    import pandas as pd

    pq_tenants = pd.read_parquet(pq_path).query("level == 'tenant'")
    assert len(pq_tenants) == 2
    for _i, row in pq_tenants.iterrows():
        for c in LENS_COLUMNS:
            close(row[c], by_tenant[row["tenant"]][c])
    focus = list(csv.DictReader(focus_path.open()))
    for t, exp in by_tenant.items():
        for xc, c in LENS_FOCUS:
            close(sum(float(r[xc] or 0) for r in focus if r["SubAccountId"] == t), exp[c], 1e-5)
    assert any(float(r["x_Fp32GpuHours"] or 0) > 0 for r in focus)
    from tests.focus_validator import Unavailable, validate   # the pipe columns pass as x_ extension columns
    from tests.services import unavailable

    try:
        v = validate(focus_path)
    except Unavailable as exc:
        unavailable(str(exc))
    assert v.failed == [], v.summary()
    # the three readers: the lines (default), the receipts' JSON column-wise, and the dict path
    dict_rows = build_statement(eng, "2026-09", columnar=False).rows
    for rows in (build_statement(eng, "2026-09").rows, issued_columns.read_month(eng, "2026-09").usage.rows):
        key = ["job_id", *LENS_COLUMNS]
        assert rows[key].sort_values("job_id").reset_index(drop=True).equals(
            dict_rows[key].sort_values("job_id").reset_index(drop=True))
    eng.dispose()


def test_the_lens_computed_in_worker_processes_equals_the_in_process_lens(tmp_path, monkeypatch):
    """The lens is computed beside the attribution, in the workers on a big run: the same receipt either way."""
    import importlib

    from ledger.method.lens import LensSettings
    from ledger.receipts import receipt_for
    from tests.test_receipt_replay import spy_attribute_all

    gmod = importlib.import_module("ledger.receipts.gather")
    url = f"sqlite:///{tmp_path / 'w.db'}"
    _ledger(url, [(f"GPU-w-{i}", SKUS[i % 2], [(0.9, 0.2 * i if i else None, 1500.0 + 100 * i, 0.3, 0.4)] * 12)
                  for i in range(4)])
    eng = db_mod.make_engine(url)
    here = receipt_for(eng, "9100", lens=LensSettings())
    monkeypatch.setattr(gmod, "PARALLEL_MIN_DEVICES", 2)
    calls = spy_attribute_all(monkeypatch, gmod)
    there = receipt_for(eng, "9100", workers=2, lens=LensSettings())
    eng.dispose()
    assert calls and calls[0] is not None and all(v[1] is not None for v in calls[0].values())
    assert "effective_compute" in here.body and here.body["effective_compute"]["tensor_gpu_hours"] > 0
    assert there.canonical() == here.canonical()


def test_odd_lens_values_in_a_receipt_count_zero_on_both_statement_paths():
    """A receipt's lens figures are the ledger's own, but a statement reads whatever an issue holds: text, a
    bool, an infinity or a missing block never becomes a figure, and the column path agrees with the dict path."""
    import pandas as pd

    from reports.lens_columns import LENS_COLUMNS, LENS_FIELDS, lens_columns_of, lens_values

    blocks = [None, "x", {"tensor_gpu_hours": "1.5", "rated_pflop_hours": True, "achieved_pflop_hours": 2.0,
                          "unmeasured_gpu_hours": float("inf"), "bound_split": {"compute": 0.5, "memory": "a"}},
              {"tensor_gpu_hours": 3.0, "unmeasured_gpu_hours": 1.0, "bound_split": None}]
    paid, delivered = np.array([2.0, 3.0, 4.0, 5.0]), np.array([1.0, 1.0, 2.0, 4.0])
    want = [lens_values({"effective_compute": b} if b is not None else {}, p, d)
            for b, p, d in zip(blocks, paid, delivered)]
    assert want[0][-1] == 2.0 and want[1][-1] == 3.0 and sum(want[0][:-1]) == 0.0  # no lens: paid unmeasured
    assert want[2][LENS_COLUMNS.index("achieved_pflop_hours")] == 2.0
    assert want[2][LENS_COLUMNS.index("tensor_gpu_hours")] == 0.0 and want[2][-1] == 0.0
    assert want[2][LENS_COLUMNS.index("compute_bound_gpu_hours")] == 1.0
    # the column reader's frame: JSON type names for containers, numbers only where the JSON had a number
    frame = {"ec": [None, "VARCHAR", "OBJECT", "OBJECT"]}
    for name, path, _types in LENS_FIELDS[1:]:
        key = path.split(".")[-1]
        vals = []
        for b in blocks:
            src = b if isinstance(b, dict) else {}
            if path.startswith("effective_compute.bound_split."):
                src = src.get("bound_split") if isinstance(src.get("bound_split"), dict) else {}
            v = src.get(key)
            vals.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan)
        frame[name] = vals
    got = lens_columns_of(pd.DataFrame(frame), paid, delivered)
    for j, c in enumerate(LENS_COLUMNS):
        assert got[c].tolist() == [w[j] for w in want], c


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.0])),
                max_size=40))
def test_the_one_pass_unit_check_answers_as_the_two_reductions_do(values):
    """_in_unit (one reduction over the bit patterns where every value lies in [+0.0, 1.0]) gives the largest
    value or None exactly as _in_unit_reference (min and max) does: -0.0, NaN, infinities and values outside."""
    import numpy as np

    from ledger.method.lens import _in_unit, _in_unit_reference

    x = np.array(values, dtype=np.float64)
    got, want = _in_unit(x), _in_unit_reference(x)
    assert (got is None) == (want is None)
    assert got is None or (got == want and np.signbit(got) == np.signbit(want))


def test_ask_which_tenant_got_the_most_math_gives_the_statements_figures(tmp_path, runner, cli):
    """`ask "which tenants got the most math per GPU-hour"` answers from the month's statement: each tenant's paid
    and achieved PFLOP-hours are the `export monthly` JSON's own, the ratio is theirs, the order follows it, and a
    tenant whose receipts measured no lens is listed as unknown, never as zero math."""
    from reports.export import HOURS_DECIMALS
    from ledger.agents.query import STATEMENT_DP

    assert STATEMENT_DP == HOURS_DECIMALS
    url = f"sqlite:///{tmp_path / 'm.db'}"
    _ledger(url, [("GPU-m-0", SKUS[0], [(0.9, 0.2, 1500.0, 0.5, 0.2)] * 12)], job="9300", account="chem")
    _ledger(url, [("GPU-m-1", SKUS[0], [(0.95, 0.9, 1980.0, 0.6, 0.2)] * 10),
                  ("GPU-m-2", SKUS[0], [(0.9, 0.7, 1800.0, 0.6, 0.2)] * 10)], job="9301", account="astro")
    _ledger(url, [("GPU-m-3", SKUS[1], [(0.5, 0.5, 1200.0, 0.5, 0.5)] * 7)], job="9302", account="bio")
    cfg10, cfg12 = _config(tmp_path, "1.0.0"), _config(tmp_path, "1.2.0")
    for job, cfg in (("9300", cfg12), ("9301", cfg12), ("9302", cfg10)):
        res = runner.invoke(cli, ["--db", url, "--config", cfg, "receipt", job, "--issue"])
        assert res.exit_code == 0, res.output
    nov = _json(runner, cli, "--db", url, "export", "monthly", "--month", "2026-09", "--format", "json",
                "--out", "-")
    stated = {r["tenant"]: r for r in nov["tenants"]}
    for question in ("which tenants got the most math per GPU-hour in 2026-09?",
                     "Which tenant did the most math per paid GPU-hour"):   # no period: the latest data's month
        got = _json(runner, cli, "--db", url, "ask", question, "--json")
        assert got["form"] == "math" and got["period_label"] == "2026-09"
        rows = got["ranking"]
        assert [r["tenant"] for r in rows] == ["astro", "chem", "bio"]
        for r in rows:
            s = stated[r["tenant"]]
            assert (r["paid"], r["achieved_pflop_hours"], r["rated_pflop_hours"]) == \
                (s["paid"], s["achieved_pflop_hours"], s["rated_pflop_hours"])
        for r in rows[:2]:
            assert r["pflop_hours_per_paid_gpu_hour"] == round(r["achieved_pflop_hours"] / r["paid"], 6) > 0
        assert rows[0]["pflop_hours_per_paid_gpu_hour"] > rows[1]["pflop_hours_per_paid_gpu_hour"]
        assert rows[2]["pflop_hours_per_paid_gpu_hour"] is None and rows[2]["rated_share"] is None  # 1.0: unknown
        assert "bio" in got["answer"] and "unknown, not zero" in got["answer"]
    for tenant in ("astro", "bio"):   # explain on the billed month carries the same lens figures
        ex = _json(runner, cli, "--db", url, "explain", "--tenant", tenant, "--period", "2026-09", "--json")
        ec = ex["billed"]["effective_compute"]
        assert (ec["achieved_pflop_hours"], ec["rated_pflop_hours"], ec["lens_unmeasured_gpu_hours"]) == \
            (stated[tenant]["achieved_pflop_hours"], stated[tenant]["rated_pflop_hours"],
             stated[tenant]["lens_unmeasured_gpu_hours"])
    shown = runner.invoke(cli, ["--db", url, "explain", "--tenant", "astro", "--period", "2026-09"])
    assert shown.exit_code == 0 and "effective compute (issued receipts)" in shown.output, shown.output
    text = runner.invoke(cli, ["--db", url, "ask", "which tenants got the most math per GPU-hour in 2026-09"])
    assert text.exit_code == 0 and "astro" in text.output and "unknown" in text.output
    for q, says in (("which tenants got the most math per GPU-hour this week", "not a calendar month"),
                    ("which tenants got the most math per GPU-hour in 2026-08", "no data")):
        res = runner.invoke(cli, ["--db", url, "ask", q])
        assert res.exit_code != 0 and says in res.output, res.output
