"""A finding for every loss bucket (issue 28): HW slowdown (power brake) and sync-boost losses, measured in the
account's ``throttled.*`` buckets, are named by findings; the sync-boost finding names the slowest member holding
the group back. Captures shaped like the issue's miss: one node's ``dcgmi dmon`` file, as `pathb-command` makes it."""

from __future__ import annotations

import json
from pathlib import Path

from ledger.sim.captures import DMON_COLUMNS, DMON_UNITS

BRAKED, SLOWEST = 5, 2
HOURS = 6


def _dmon_capture(path: Path, brake: bool = True, sync: bool = True) -> Path:
    """8 GPUs at full load for HOURS at 60 s. GPU BRAKED carries the HW power-brake bit (0x80) at a low clock from
    hour 1 on; from hour 3 to hour 5 the other GPUs carry the sync-boost bit (0x10), held to GPU SLOWEST's clock."""
    lines = ["# ipledger-start 2026-11-02T00:00:00Z node=gpu-07 interval_ms=60000"]
    for k in range(HOURS * 60):
        if k % 14 == 0:
            lines += ["#Entity   " + "  ".join(c for c, _, _ in DMON_COLUMNS), "ID        " + "  ".join(DMON_UNITS)]
        for g in range(8):
            clk, reason, power = 1980, 0, 690 - (k + g) % 5
            if sync and 180 <= k < 300 and g != BRAKED:
                clk, reason = 1500, (0 if g == SLOWEST else 0x10)
                power = 520 if g == SLOWEST else 560
            if brake and g == BRAKED and k >= 60:
                clk, reason, power = 1200, 0x80, 450
            lines.append(f"GPU {g}     0.900  0.700  98  {clk}  {power}.00  70  {reason}  0  60000  0")
    path.write_text("\n".join(lines) + "\n")
    return path


def _analyze(runner, cli, src: Path) -> dict:  # noqa: ANN001
    r = runner.invoke(cli, ["analyze", str(src), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_hw_slowdown_and_sync_boost_losses_are_findings(runner, cli, tmp_path):
    out = _analyze(runner, cli, _dmon_capture(tmp_path / "dmon-gpu-07.txt"))
    found = out["findings"]
    thr = out["account"]["buckets"]["throttled"]
    hw = [f for f in found if f["kind"] == "hw_slowdown"]
    assert [f["scope"]["device_uuid"] for f in hw] == [f"gpu-07/gpu{BRAKED}"], [(f["kind"], f["scope"]) for f in found]
    sb = [f for f in found if f["kind"] == "sync_boost"]
    assert len(sb) == 1 and sb[0]["slowest_device"] == f"gpu-07/gpu{SLOWEST}"
    assert sb[0]["scope"]["node"] == "gpu-07" and f"gpu-07/gpu{SLOWEST}" not in sb[0]["held_devices"]
    # each finding's hours are its bucket's (one device braked, one node held): the account and the findings agree
    assert abs(hw[0]["gpu_hours"] - thr["hw_slowdown"]) < 0.01
    assert abs(sb[0]["gpu_hours"] - thr["sync_boost"]) < 0.01
    assert hw[0]["gpu_hours"] > 1.0 and sb[0]["gpu_hours"] > 1.0


def test_no_reason_bits_no_reason_findings(runner, cli, tmp_path):
    """The same capture without the brake and the sync boost: neither finding (the rule is the bits, not the clock)."""
    found = _analyze(runner, cli, _dmon_capture(tmp_path / "dmon-gpu-07.txt", brake=False, sync=False))["findings"]
    assert not [f for f in found if f["kind"] in ("hw_slowdown", "sync_boost")]
