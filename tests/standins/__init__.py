"""Stand-in tools for the tests (dcgmi, nvidia-smi, amd-smi, scontrol, sacct) and a helper that sets up a site for them.

The executables answer in the real formats and keep state in one directory. Slurm runs hooks with a minimal
environment (no PATH, no STANDIN_STATE), so :func:`make_site` writes one small wrapper per tool that names the
absolute interpreter and the state directory, and a site config whose ``[commands]`` point at the wrappers.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOLS = ("dcgmi", "nvidia-smi", "amd-smi", "scontrol", "sacct")


@dataclass
class Site:
    root: Path
    state: Path
    bin: Path
    spool: Path
    config: Path
    gpus: list

    def control(self, **kw) -> None:
        """Merge settings into the stand-ins' control file (see each stand-in's docstring)."""
        path = self.state / "control.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data.update(kw)
        path.write_text(json.dumps(data))

    def clear_control(self) -> None:
        (self.state / "control.json").write_text("{}")

    def scontrol_record(self, job_id: str, line: str) -> None:
        d = self.state / "scontrol"
        d.mkdir(exist_ok=True)
        (d / f"{job_id}.txt").write_text(line.strip() + "\n")

    def sacct_record(self, job_id: str, lines: list[str]) -> None:
        d = self.state / "sacct"
        d.mkdir(exist_ok=True)
        (d / f"{job_id}.txt").write_text("".join(line + "\n" for line in lines))

    def sacct_calls(self) -> list:
        p = self.state / "sacct_calls.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

    def dcgm_calls(self) -> list:
        p = self.state / "dcgm_calls.json"
        return json.loads(p.read_text()) if p.exists() else []


def fake_uuid(node: str, index: int) -> str:
    h = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def make_site(root: Path, *, node: str = "node1", ngpus: int = 4, tools=("dcgmi", "nvidia-smi", "scontrol"),
              scontrol_path: str | None = None, db: str | None = None, cluster: str | None = None,
              hooks: dict | None = None, python: str | None = None, timeout: float = 3.0,
              extra_commands: dict | None = None) -> Site:
    root = Path(root)
    state, bindir, spool = root / "standin-state", root / "bin", root / "spool"
    for d in (state, bindir, spool):
        d.mkdir(parents=True, exist_ok=True)
    gpus = [{"index": i, "minor": i, "uuid": fake_uuid(node, i), "name": "NVIDIA H100 80GB HBM3",
             "pci": f"00000000:{0x1B + 0x10 * i:02X}:00.0"} for i in range(ngpus)]
    (state / "gpus.json").write_text(json.dumps({"gpus": gpus}))
    (state / "amd_gpus.json").write_text(json.dumps({"gpus": [
        {"index": i, "uuid": f"{i:02x}ff74a1-0000-1000-80e8-{i:012x}", "bdf": f"0000:{0x0c + i:02x}:00.0",
         "market_name": "AMD Instinct MI300X"} for i in range(ngpus)]}))
    (state / "control.json").write_text("{}")
    py = python or sys.executable
    commands = {}
    for tool in tools:
        if tool == "scontrol" and scontrol_path:
            commands[tool] = scontrol_path
            continue
        wrapper = bindir / tool
        wrapper.write_text(f"#!/bin/sh\nSTANDIN_STATE='{state}' exec '{py}' '{HERE / tool}' \"$@\"\n")
        wrapper.chmod(0o755)
        commands[tool] = str(wrapper)
    commands.update(extra_commands or {})
    lines = [f'spool = "{spool}"']
    if db:
        lines.append(f'db = "{db}"')
    if cluster:
        lines.append(f'cluster = "{cluster}"')
    lines.append(f"hook_timeout_s = {timeout}")
    lines.append("[commands]")
    lines += [f'"{k}" = "{v}"' for k, v in commands.items()]
    # Test sites keep the drop places beside the spool (one tmp directory); the tests of the drop place's own
    # filesystem (tests/test_drop_place.py) mount a tmpfs or set this to false.
    hooks = {"drop_dir_shared_fs": True, **(hooks or {})}
    if hooks:
        lines.append("[hooks]")
        for k, v in hooks.items():
            lines.append(f"{k} = {json.dumps(v)}")
    config = root / "config.toml"
    config.write_text("\n".join(lines) + "\n")
    return Site(root=root, state=state, bin=bindir, spool=spool, config=config, gpus=gpus)


def with_derived(records: list[dict]) -> list[dict]:
    """Spool records plus what ship derives from their raw tool output (``tool_output``), as ship would
    chain them: the entries a run ends up with in the ledger, without a database."""
    from ledger.chain.entries import entry_from_record
    from ledger.capture.sources.observed import derive

    out = []
    for r in records:
        out.append(r)
        if r.get("kind") == "tool_output":
            for e in derive(entry_from_record(r)):
                d = e.to_record()
                if "data" in r:
                    d["data"] = e.data
                out.append(d)
    return out
