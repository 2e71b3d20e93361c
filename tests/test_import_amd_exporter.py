"""ROCm device-metrics-exporter series through the Prometheus importer (docs/telemetry.md, "ROCm
device-metrics-exporter").

* ``ipledger import prometheus`` of the exporter's /federate pulls with the TOTAL_16/32/64_OPS counters, then
  ``receipt --json`` under method 1.2.0: achieved FLOPs are the counted operations (flops_source "op_counters"),
  equal to the sum of the counters' deltas read from the fixture itself (a reset counts the reading after it);
* the same pulls without the counters: achieved FLOPs from MFMA activity × peak (flops_source "activity");
  both receipts' time identity is the same;
* the importer reports the exporter's names it does not map, keys devices by host and gpu_id with the SKU
  from card_model, and refuses as op counts a series that is not a cumulative counter;
* :func:`ledger.importers.op_counters.fp_ops` (hypothesis): never negative, equal to the counted deltas.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from ledger.importers import prometheus
from ledger.importers.op_counters import fp_ops

FIX = Path(__file__).parent / "fixtures" / "amd_exporter"
WITH_OPS = FIX / "mi300x_federate_op_counters.prom"
ACTIVITY_ONLY = FIX / "mi300x_federate_activity_only.prom"
_SAMPLE = re.compile(r'^(amd_\w+)\{(.*)\} (\S+) (\d+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _readings(path: Path) -> dict[tuple[str, str], list[tuple[float, float, dict]]]:
    """(metric, gpu_id) -> [(t, value, labels)] in time order, read from the fixture with a plain regex."""
    out: dict[tuple[str, str], list] = {}
    for line in path.read_text().splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2)))
            out.setdefault((m.group(1), labels["gpu_id"]), []).append((int(m.group(4)) / 1000, float(m.group(3)), labels))
    return {k: sorted(v, key=lambda r: r[0]) for k, v in out.items()}


def _config(tmp_path: Path) -> str:
    cfg = tmp_path / "site.toml"
    cfg.write_text('method_version = "1.2.0"\ncompute_precision = "bf16"\n')
    os.chmod(cfg, 0o600)
    return str(cfg)


def _import_and_receipt(runner, cli, tmp_path: Path, fixture: Path, name: str):  # noqa: ANN001
    from ledger.chain import db as db_mod

    url = f"sqlite:///{tmp_path / (name + '.db')}"
    eng = db_mod.make_engine(url)
    db_mod.upgrade(eng)
    eng.dispose()
    cfg = _config(tmp_path)
    imp = runner.invoke(cli, ["--db", url, "--config", cfg, "import", "prometheus", str(fixture)])
    assert imp.exit_code == 0, imp.output
    rec = runner.invoke(cli, ["--db", url, "--config", cfg, "receipt", "4711", "--json"])
    assert rec.exit_code == 0, rec.output
    return imp.output, json.loads(rec.stdout)


def _counted_ops(path: Path) -> float:
    """Σ over GPUs, counters and the job's intervals of the counter's delta (after a fall: the new reading)."""
    total = 0.0
    for (metric, _gpu), rows in _readings(path).items():
        if "_ops" not in metric:
            continue
        for (_t0, a, lab), (_t1, b, _lab1) in zip(rows, rows[1:]):
            if lab["job_id"] == "4711":   # the interval starting at a reading of the job
                total += b - a if b >= a else b
    return total


def test_op_counters_give_achieved_flops_and_the_receipt_says_so(runner, cli, tmp_path):
    out, rec = _import_and_receipt(runner, cli, tmp_path, WITH_OPS, "ops")
    ec = rec["effective_compute"]
    assert ec["method"]["version"] == "1.2.0"
    assert ec["flops_source"] == "op_counters"
    expected = _counted_ops(WITH_OPS) / 1e15 / 3600
    assert expected > 0
    assert abs(ec["achieved_pflop_hours"] - expected) <= 1e-9
    # the reset on GPU 1 is bridged: counting its fall as a delta would have lowered the total
    rows = _readings(WITH_OPS)[("amd_gpu_prof_total_16_ops", "1")]
    assert any(b < a for (_t, a, _l), (_u, b, _m) in zip(rows, rows[1:]))
    assert "not mapped: amd_gpu_clock" in out and "amd_gpu_prof_valu_pipe_issue_util" in out


def test_without_op_counters_achieved_flops_come_from_activity_and_the_time_identity_is_the_same(runner, cli,
                                                                                             tmp_path):
    _, with_ops = _import_and_receipt(runner, cli, tmp_path, WITH_OPS, "ops")
    _, activity = _import_and_receipt(runner, cli, tmp_path, ACTIVITY_ONLY, "act")
    ec = activity["effective_compute"]
    assert ec["flops_source"] == "activity"
    # no clock series: the ratio is 1, so achieved / rated is the time-weighted MFMA activity of the job
    ten = [v / 100 for (m, _g), rows in _readings(ACTIVITY_ONLY).items() if m == "amd_gpu_prof_tensor_active_percent"
           for _t, v, lab in rows if lab["job_id"] == "4711"]
    assert abs(ec["rated_share"] - sum(ten) / len(ten)) < 1e-6
    assert ec["rated_pflop_hours"] == with_ops["effective_compute"]["rated_pflop_hours"]
    for key in ("gpu_hours", "unknown_intervals"):
        assert activity.get(key) == with_ops.get(key), key
    assert [d.get("sku") for d in activity["job"]["devices"]] == ["AMD Instinct MI300X"] * 2


def test_devices_labels_and_mapped_names():
    c = prometheus.parse(WITH_OPS.read_text(), str(WITH_OPS))
    assert sorted(c.devices) == ["mi300x-node-07/gpu0", "mi300x-node-07/gpu1"]
    d = c.devices["mi300x-node-07/gpu1"]
    assert (d.vendor, d.sku, d.index, d.node) == ("amd", "AMD Instinct MI300X", 1, "mi300x-node-07")
    rep = c.report()
    assert rep["mapped_fields"]["amd_gpu_prof_total_16_ops"] == "fp_ops"
    assert rep["mapped_fields"]["amd_gpu_energy_consumed"] == "energy_j"
    assert set(rep["unmapped_fields"]) == {"amd_gpu_clock", "amd_gpu_prof_valu_pipe_issue_util"}
    arrays = c.device_arrays("mi300x-node-07/gpu0")
    assert "fp_ops" in arrays and not any(k.startswith("ops_") for k in arrays)
    # percent -> fraction, uJ -> J, as the exporter's help text states the units
    t, v = arrays["tensor_active"]
    raw = _readings(WITH_OPS)[("amd_gpu_prof_tensor_active_percent", "0")]
    assert np.allclose(v, [r[1] / 100 for r in raw])
    t, v = arrays["energy_j"]
    assert np.allclose(v, [r[1] / 1e6 for r in _readings(WITH_OPS)[("amd_gpu_energy_consumed", "0")]])


def test_a_series_that_is_no_cumulative_counter_gives_no_op_count():
    """Per-window counts (a value that rises and falls at random) are not read as cumulative: no fp_ops, and the
    import says why."""
    lines = []
    for i, v in enumerate([5e12, 2e12, 7e12, 1e12, 6e12, 3e12]):
        lines.append(f'amd_gpu_prof_total_32_ops{{gpu_id="0",hostname="h"}} {v:.0f} {(1793613600 + 30 * i) * 1000}')
        lines.append(f'amd_gpu_gfx_activity{{gpu_id="0",hostname="h"}} 90 {(1793613600 + 30 * i) * 1000}')
    c = prometheus.parse("\n".join(lines) + "\n", "window.prom")
    assert "fp_ops" not in c.device_arrays("h/gpu0")
    assert any("not a cumulative counter" in w for w in c.report()["warnings"])


counter = st.lists(st.tuples(st.floats(0, 1e14), st.booleans()), min_size=2, max_size=30)


@settings(max_examples=60, deadline=None)
@given(steps=counter, other=st.floats(0, 1e14))
def test_fp_ops_is_never_negative_and_sums_the_counted_deltas(steps, other):
    """A counter built from non-negative increments with at most one reset: each interval's fp_ops is the
    increment (after the reset: the reading), the last interval unknown, and none negative."""
    t = 1793613600.0 + 30.0 * np.arange(len(steps))
    v, cur, expected, reset_done = [], 1e12, [], False
    for k, (inc, reset) in enumerate(steps):
        v.append(cur)
        if k + 1 < len(steps):
            if reset and not reset_done and inc < cur:
                cur, reset_done = inc, True      # a restart: counting starts again
            else:
                cur = cur + inc
            expected.append(inc + other)
    t32 = np.array(v) * 0 + other * np.arange(len(steps))
    times, ops, why = fp_ops({"ops_16": (t, np.array(v)), "ops_32": (t, t32)})
    assert why is None
    assert np.isnan(ops[-1])
    assert np.all(ops[:-1] >= 0)
    assert np.allclose(ops[:-1], expected, rtol=1e-12, atol=1e-12 * max(v) + 1e-3)   # float64 differences
