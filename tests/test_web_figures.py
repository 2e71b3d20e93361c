"""ledger.web.figures' device charts on a hand-made device: throttled hours shaded by their largest reason,
unknown telemetry (a field missing, a recorded gap) marked and the lines broken there, a finding's window
outlined; and the figures child answers what the in-process call answers."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ledger.web.figures import MIN_THROTTLE_SHARE, ask, device_chart, device_figures

H0 = 1_794_000_000 // 3600   # an hour in 2026-11


def _device(hours: int = 10) -> pd.DataFrame:
    """One sample per hour of one device in a run: hour 3 throttled (power_cap, index 1), hour 4 throttled a
    little (below the shading threshold), hour 6 with its fields missing, hour 7 with no sample at all."""
    rows = []
    for i in range(hours):
        if i == 7:
            continue
        rows.append({"device": "GPU-x", "node": "n1", "t": (H0 + i) * 3600.0 + 60, "ai": 0, "h": 1.0,
                     "h_del": 0.5 if i == 3 else 1.0, "h_thr": {3: 0.5, 4: MIN_THROTTLE_SHARE / 2}.get(i, 0.0),
                     "rbucket": 1.0, "h_missing": 1.0 if i == 6 else 0.0,
                     "clk": np.nan if i == 6 else 1400.0, "power": np.nan if i == 6 else 300.0,
                     "temp": np.nan if i == 6 else 60.0})
    return pd.DataFrame(rows)


def test_device_chart_shades_marks_and_breaks():
    gap = {"start": (H0 + 8) * 3600.0, "end": (H0 + 8) * 3600.0 + 1200, "node": "n1", "device": None,
           "cause": "dcgm_host_engine_restart"}
    other = {**gap, "node": "n2"}   # another node's gap is not this device's
    got = device_figures(_device(), "USD", [gap, other])
    window = [((H0 + 2) * 3600.0, (H0 + 5) * 3600.0, "F1 power_cap")]
    for label, part in got["charts"].items():
        svg = device_chart(part, got["axis"], window)
        throttled = re.findall(r'class="throttle" data-reason="([a-z_]+)"', svg)
        assert throttled == ["power_cap"], label            # hour 3 only: hour 4 is under the threshold
        assert svg.count('class="unknown"') == 1, label      # hour 6's missing fields
        assert svg.count('class="unknown gap"') == 1, label  # n1's gap, not n2's
        assert "F1 power_cap" in svg and svg.count('class="finding-window"') == 1
        assert "nan" not in svg
        # the line breaks at the unknown hour 6 and the hour 7 with no sample: three pieces (0-5, none, 8-9)
        assert svg.count("<polyline") == 2, label


def test_the_child_answers_as_the_library_does(demo):
    """`ask` (a real child process, which drops the raw telemetry columns once the agents have run) and the
    in-process library calls over the whole dataset give the same fleet, scope and device answers; so does a
    month's question given its statement rows pickled by a child of their own (the ("billed", month) question)."""
    from ledger import agents
    from ledger.agents import hourly
    from ledger.chain.db import make_engine
    from ledger.web.figures import answer, bounds_of, key

    out, _ = demo
    url = f"sqlite:///{out / 'ledger.db'}"
    engine = make_engine(url, read_only=True)
    ds = hourly.load_compact(engine, detail=True)
    found = agents.find(ds)
    want_bounds = bounds_of(ds)
    node, rack = sorted(want_bounds.known["node"])[0], sorted(want_bounds.known["rack"])[-1]
    device = sorted(want_bounds.known["device"])[0]
    questions = [("fleet", "2026-11"), ("fleet", "2026-W45"), ("scope", "node", node, "all"),
                 ("scope", "rack", rack, "2026-11"), ("scope", "tenant", "astro", "2026-11"), ("device", device)]
    got = ask(url, questions, with_prefetch=False)
    assert got.bounds == want_bounds
    want = dict(answer(engine, ds, found, want_bounds, q) for q in questions)
    assert got.by_key.keys() == want.keys()
    for k in want:
        assert got.by_key[k] == want[k], k
    rows = ask(url, [("billed", "2026-11")], with_prefetch=False).by_key[("billed", "2026-11")]["rows"]
    assert rows is not None   # the demo issued November's receipts
    month = ask(url, [("fleet", "2026-11")], with_prefetch=False, billed={"2026-11": rows})
    k = key(("fleet", "2026-11"), want_bounds)
    assert month.by_key == {k: want[k]}
    # the child reports its own peak (a real reading, > 0); how large it may be is bench.web's figure, not a test's
    assert got.peak_mib > 0 and got.bounds.start < got.bounds.end
