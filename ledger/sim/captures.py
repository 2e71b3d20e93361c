"""A simulation written as the capture set a prospect sends: one ``dcgmi dmon`` or ``amd-smi monitor --csv``
file per node, as the commands ``ipledger pathb-command`` prints make them (a wall-clock start line at each
(re)start, appended), with what the real tools add: dmon's header every 14 ticks and its units line; amd-smi's
watch banner, CRLF line ends and its CSV header again at each iteration.

A tick the collector did not record (``present`` false) is a row of ``N/A``: a capture tool prints every tick
it runs, so a missing reading can never shift the ticks after it. ``restart=(node, stop_step, resume_step)``
stops that node's capture at ``stop_step`` and starts it again at ``resume_step`` (nothing written between):
appended to the same file (``restart_file="same"``) or to a second file named with its start time.

Functions: :func:`write_dmon_set`, :func:`write_amdsmi_set`; both return the paths written.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from .fleet import Simulation

DMON_COLUMNS = (("SMACT", "sm_active", "{:.3f}"), ("TENSO", "tensor_active", "{:.3f}"), ("GPUTL", "gpu_util", "{:.0f}"),
                ("SMCLK", "sm_clock_mhz", "{:.0f}"), ("POWER", "power_w", "{:.2f}"), ("TMPTR", "gpu_temp_c", "{:.0f}"),
                ("DVCCTR", "clock_reasons", "{:.0f}"), ("XIDER", "xid", "{:.0f}"), ("FBUSD", "fb_used_mib", "{:.0f}"),
                ("ESATL", "ecc_sbe_aggregate", "{:.0f}"))
DMON_UNITS = ("", "", "%", "MHZ", "W", "C", "", "", "MB", "")
AMD_COLUMNS = ("gpu", "power_usage", "hotspot_temperature", "gfx", "gfx_clock", "vram_used", "single_bit_ecc",
               "pviol", "tviol", "tviol_active", "phot_tviol", "vr_tviol", "hbm_tviol")
BANNER = "'CTRL' + 'C' to stop watching output:"


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(float(t), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _anchor(t: float, node: str, interval_s: int) -> str:
    return f"# ipledger-start {_stamp(t)} node={node} interval_ms={interval_s * 1000}"


def _pieces(sim: Simulation, node: str, start_step: int, steps: int, restart) -> list[tuple[int, int]]:  # noqa: ANN001
    """The (first, end) steps of each capture segment of this node."""
    end = start_step + steps
    if restart and restart[0] == node:
        return [(start_step, restart[1]), (restart[2], end)]
    return [(start_step, end)]


def _write_set(sim: Simulation, out: Path, nodes: list[str], vendor: str, name: tuple[str, str], start_step: int,
               steps: int, restart, restart_file: str, body, newline: str = "\n") -> list[Path]:  # noqa: ANN001
    """One file per node of ``nodes`` with ``vendor`` GPUs (``name`` = (tool, extension)); ``body(devs, a, b)``
    gives the lines the tool prints over steps [a, b). Each segment starts with its anchor, appended."""
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for node in nodes:
        devs = [i for i, d in enumerate(sim.devices) if d.node == node and d.vendor == vendor]
        for k, (a, b) in enumerate(_pieces(sim, node, start_step, steps, restart) if devs else ()):
            p = out / f"{name[0]}-{node}.{name[1]}"
            if k and restart_file != "same":
                p = out / f"{name[0]}-{node}-{_stamp(sim.t[a]).replace('-', '').replace(':', '')}.{name[1]}"
            lines = [_anchor(sim.t[a], node, sim.spec.cadence_s), *body(devs, a, b)]
            with p.open("a", encoding="utf-8", newline="") as f:
                f.write(newline.join(lines) + newline)
            if p not in paths:
                paths.append(p)
    return paths


def write_dmon_set(sim: Simulation, out: Path, nodes: list[str], start_step: int, steps: int,
                   restart: tuple[str, int, int] | None = None, restart_file: str = "same") -> list[Path]:
    """One ``dmon-<node>.txt`` per NVIDIA node of ``nodes`` over [start_step, start_step + steps)."""
    A = sim.arrays

    def body(devs: list[int], a: int, b: int) -> list[str]:
        lines = []
        for k, s in enumerate(range(a, b)):
            if k % 14 == 0:
                lines += ["#Entity   " + "  ".join(c for c, _, _ in DMON_COLUMNS), "ID        " + "  ".join(DMON_UNITS)]
            for i in devs:
                if not sim.present[i, s]:
                    vals = ["N/A"] * len(DMON_COLUMNS)
                else:
                    vals = [fmt.format(A[key][i, s] * (100.0 if key == "gpu_util" else 1.0))
                            for _, key, fmt in DMON_COLUMNS]
                lines.append(f"GPU {sim.devices[i].index}     " + "  ".join(vals))
        return lines

    return _write_set(sim, out, nodes, "NVIDIA", ("dmon", "txt"), start_step, steps, restart, restart_file, body)


def write_amdsmi_set(sim: Simulation, out: Path, nodes: list[str], start_step: int, steps: int,
                     restart: tuple[str, int, int] | None = None, restart_file: str = "same") -> list[Path]:
    """One ``amdsmi-<node>.csv`` per AMD node of ``nodes`` (``amd-smi monitor ... --violation --csv -w``): the
    watch banner, CRLF line ends, the header again at each iteration; violation columns from the simulated
    clock-event reasons (0x4 power -> PVIOL, 0x20 thermal -> TVIOL and TVIOL_ACTIVE, 0x8 -> PHOT_TVIOL)."""
    A = sim.arrays

    def body(devs: list[int], a: int, b: int) -> list[str]:
        lines = [BANNER]
        for s in range(a, b):
            lines.append(",".join(AMD_COLUMNS))
            for i in devs:
                if not sim.present[i, s]:
                    lines.append(",".join([str(sim.devices[i].index)] + ["N/A"] * (len(AMD_COLUMNS) - 1)))
                    continue
                r = int(A["clock_reasons"][i, s])
                pct = ["100" if r & bit else "0" for bit in (0x4, 0x20)]
                lines.append(",".join([
                    str(sim.devices[i].index), f"{A['power_w'][i, s]:.0f}", f"{A['gpu_temp_c'][i, s]:.0f}",
                    f"{A['gpu_util'][i, s] * 100:.0f}", f"{A['sm_clock_mhz'][i, s]:.0f}",
                    f"{A['fb_used_mib'][i, s]:.0f}", f"{A['ecc_sbe_aggregate'][i, s]:.0f}", *pct,
                    "True" if r & 0x20 else "False", "100" if r & 0x8 else "0", "0", "0"]))
        return lines

    return _write_set(sim, out, nodes, "AMD", ("amdsmi", "csv"), start_step, steps, restart, restart_file, body,
                      newline="\r\n")


__all__ = ["write_dmon_set", "write_amdsmi_set"]
