"""NVIDIA device inventory and snapshots: ``nvidia-smi`` CSV / ``-L`` / ``-q`` parsers and NVML's MIG devices.

The hooks map Slurm's GPU indices to UUIDs and SKUs with ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``
(:mod:`ledger.capture.hooks.vendor`); :func:`nvml_mig_devices` reads MIG instances through ``nvidia-ml-py`` (``pynvml``).
Placeholders (``[N/A]``, ``N/A``, ``[Not Supported]``) become missing fields with their cause, never zeros.
"""

from __future__ import annotations

from ...base.frozen import Frozen
# The inventory parser the hooks need to name their GPUs lives with them; named here too for the importers.
from ..hooks.vendor import (  # noqa: F401
    INVENTORY_FIELDS, PLACEHOLDERS, CsvRows, NvidiaGpu, is_integer_text, parse_inventory_csv,
    parse_query_csv
)


def parse_list(text: str) -> list[NvidiaGpu]:
    """``nvidia-smi -L``: ``GPU 0: NAME (UUID: GPU-...)``; indented MIG rows belong to the GPU above (skipped)."""
    import re

    gpus = []
    for ln in text.splitlines():
        m = re.match(r"GPU (\d+): (.*) \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$", ln)
        if m:
            gpus.append(NvidiaGpu(index=int(m.group(1)), name=m.group(2).strip(), uuid=m.group(3)))
    return gpus


class MigDevice(Frozen):
    """A MIG device under its parent GPU, as ``nvidia-smi -L`` lists it or NVML enumerates it. ``gpu_instance``
    (the GI id that keys the device ``<parent UUID>/gi<id>``, as dcgm-exporter's ``GPU_I_ID``) is known from
    NVML only; ``-L`` prints a per-parent device number instead."""

    __slots__ = ("parent_uuid", "parent_index", "profile", "device", "uuid", "gpu_instance")
    _defaults = {"gpu_instance": None}
    parent_uuid: str
    parent_index: int
    profile: str | None
    device: int
    uuid: str | None
    gpu_instance: int | None


def parse_mig_list(text: str) -> list[MigDevice]:
    """``nvidia-smi -L``'s indented ``MIG 2g.20gb Device 0: (UUID: MIG-...)`` rows, each with its parent GPU."""
    import re

    out, parent = [], None
    for ln in text.splitlines():
        m = re.match(r"GPU (\d+): .* \(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$", ln)
        if m:
            parent = (m.group(2), int(m.group(1)))
            continue
        m = re.match(r"\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[0-9a-fA-F-]+)\)\s*$", ln)
        if m and parent is not None:
            out.append(MigDevice(parent_uuid=parent[0], parent_index=parent[1], profile=m.group(1),
                                 device=int(m.group(2)), uuid=m.group(3)))
    return out


def parse_clock_event_reasons(text: str) -> list[dict]:
    """``nvidia-smi -q -d PERFORMANCE``: per GPU, each clock throttle/event reason -> active (bool) or None (N/A)."""
    import re

    gpus: list[dict] = []
    cur: dict | None = None
    in_block = False
    for ln in text.splitlines():
        m = re.match(r"GPU ([0-9A-Fa-f:.]+)\s*$", ln)
        if m:
            cur = {"pci_bus_id": m.group(1), "reasons": {}, "missing": {}}
            gpus.append(cur)
            in_block = False
            continue
        if cur is None:
            continue
        s = ln.strip()
        if re.match(r"Clocks (Throttle|Event) Reasons\s*(:.*)?$", s):
            if ":" in s and s.split(":", 1)[1].strip() in PLACEHOLDERS:
                cur["missing"]["clock_event_reasons"] = PLACEHOLDERS[s.split(":", 1)[1].strip()]
                in_block = False
            else:
                in_block = True
            continue
        if in_block and ":" in s:
            k, v = (x.strip() for x in s.split(":", 1))
            if v in ("Active", "Not Active"):
                cur["reasons"][k] = v == "Active"
            elif v in PLACEHOLDERS:
                cur["missing"][k] = PLACEHOLDERS[v]
            else:
                in_block = False
        elif in_block and s and ":" not in s:
            in_block = False
    return gpus


def nvml_mig_devices(nvml) -> list[MigDevice]:  # noqa: ANN001 - the pynvml module, passed in (tests pass a stand-in)
    """The MIG devices of every GPU in MIG mode, through NVML: GPU instance id, UUID and the profile, named
    ``<slices>g.<GiB rounded up>gb`` from the instance's ``gpuInstanceSliceCount`` and ``memorySizeMB`` (nvmlDeviceGetAttributes).
    A value NVML refuses is None (the instance is still listed); GPUs not in MIG mode contribute nothing."""
    nvml.nvmlInit()
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(h)
            except nvml.NVMLError:   # not MIG-capable
                continue
            if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
                continue
            parent = _text(nvml.nvmlDeviceGetUUID(h))
            for k in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
                try:
                    m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except nvml.NVMLError:   # an empty slot
                    continue
                out.append(MigDevice(parent_uuid=parent, parent_index=i, profile=_mig_profile(nvml, m), device=k,
                                     uuid=_nvml_or_none(nvml, nvml.nvmlDeviceGetUUID, m),
                                     gpu_instance=_nvml_or_none(nvml, nvml.nvmlDeviceGetGpuInstanceId, m)))
        return out
    finally:
        nvml.nvmlShutdown()


def _text(v):  # noqa: ANN001, ANN202
    return v.decode() if isinstance(v, bytes) else v


def _nvml_or_none(nvml, fn, handle):  # noqa: ANN001, ANN202
    try:
        return _text(fn(handle))
    except nvml.NVMLError:
        return None


def _mig_profile(nvml, handle) -> str | None:  # noqa: ANN001
    attrs = _nvml_or_none(nvml, nvml.nvmlDeviceGetAttributes, handle)
    slices = getattr(attrs, "gpuInstanceSliceCount", None)
    mb = getattr(attrs, "memorySizeMB", None)
    if not slices or not mb:
        return None
    return f"{slices}g.{-(-int(mb) // 1024)}gb"   # GiB rounded up, as NVIDIA names profiles (40192 MiB: 3g.40gb)
