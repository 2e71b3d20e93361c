"""A bench figure's row in docs/performance.md: the table's worst subject, unless the figure's verdict covers
more than its table (bench.analyze_captures: two sets, each against its own floor, and two memory peaks), when
its summary decides: a set that misses its target makes the row NOT met even where the table's subject meets."""

from __future__ import annotations

from bench.common import Figure, Timing

FLOOR = Timing("floor", (1.0, 1.0, 1.0))
FAST = Timing("dmon", (2.5, 2.5, 2.5))


def test_headline_is_the_worst_subject_without_a_summary():
    fig = Figure(key="k", title="t", target=3.0, floor=FLOOR, subjects=(FAST,))
    assert fig.headline() == ("2.50× (dmon)", "met")


def test_a_summary_decides_the_row():
    fig = Figure(key="k", title="t", target=3.0, floor=FLOOR, subjects=(FAST,),
                 summary=("dmon 2.50×, amd-smi 5.87×; 700 / 600 MiB", False))
    assert fig.headline() == ("dmon 2.50×, amd-smi 5.87×; 700 / 600 MiB", "NOT met")
    failed = Figure(key="k", title="t", target=3.0, floor=FLOOR, subjects=(FAST,), status="failed: x",
                    summary=("dmon 2.50×", True))
    assert failed.headline() == ("failed: x", "NOT met")
