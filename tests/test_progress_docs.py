"""docs/progress.md's framework callbacks, run as written: the page's Python blocks are extracted and executed
against stand-in base classes for PyTorch Lightning and Transformers (not installed here), and each callback's
mark must land in the spool with the step it was given — only on rank 0."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "progress.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def _block(name: str) -> str:
    (code,) = [b for b in _blocks() if f"class {name}" in b]
    return code


@pytest.fixture()
def stubs(monkeypatch, tmp_path):
    calls = []

    class ModelCheckpoint:  # what Lightning's does in _save_checkpoint: write the file
        def _save_checkpoint(self, trainer, filepath):
            calls.append(filepath)

    class TrainerCallback:
        pass

    mods = {"lightning": types.ModuleType("lightning"), "lightning.pytorch": types.ModuleType("lightning.pytorch"),
            "lightning.pytorch.callbacks": types.ModuleType("lightning.pytorch.callbacks"),
            "transformers": types.ModuleType("transformers")}
    mods["lightning.pytorch.callbacks"].ModelCheckpoint = ModelCheckpoint
    mods["transformers"].TrainerCallback = TrainerCallback
    for k, v in mods.items():
        monkeypatch.setitem(sys.modules, k, v)
    spool = tmp_path / "spool"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("IPLEDGER_SPOOL", str(spool))
    monkeypatch.setenv("IPLEDGER_CONFIG", "")
    return calls, spool


def _marks(spool: Path) -> list[dict]:
    return [dict(json.loads(r["payload"]), run=r["run"], job=r["job_id"])
            for f in sorted(spool.glob("mark-*.jsonl")) for r in map(json.loads, f.read_text().splitlines())]


def test_every_python_block_of_the_page_compiles():
    assert len(_blocks()) >= 3
    for code in _blocks():
        compile(code, str(DOC), "exec")


def test_lightning_callback_marks_after_the_checkpoint_is_written(stubs):
    calls, spool = stubs
    ns: dict = {}
    exec(compile(_block("MarkedModelCheckpoint"), str(DOC), "exec"), ns)  # noqa: S102 - the documented code
    cb = ns["MarkedModelCheckpoint"]()
    rank0 = types.SimpleNamespace(is_global_zero=True, global_step=3000, current_epoch=2)
    other = types.SimpleNamespace(is_global_zero=False, global_step=3000, current_epoch=2)
    cb._save_checkpoint(rank0, "ckpt/a.ckpt")
    cb._save_checkpoint(other, "ckpt/a.ckpt")
    assert calls == ["ckpt/a.ckpt", "ckpt/a.ckpt"]  # the checkpoint itself is still written by the base class
    assert _marks(spool) == [{"kind": "checkpoint", "step": 3000, "note": "epoch 2", "via": "spool", "run": 1,
                              "job": "4242"}]


def test_transformers_callback_marks_saves_and_evaluations(stubs):
    _calls, spool = stubs
    ns: dict = {}
    exec(compile(_block("IpledgerMarks"), str(DOC), "exec"), ns)  # noqa: S102
    cb = ns["IpledgerMarks"]()
    state = types.SimpleNamespace(is_world_process_zero=True, global_step=500, epoch=1.5)
    cb.on_save(None, state, None)
    cb.on_evaluate(None, state, None, metrics={"eval_loss": 0.3})
    cb.on_save(None, types.SimpleNamespace(is_world_process_zero=False, global_step=9, epoch=None), None)
    got = sorted((m["kind"], m["step"], m["note"]) for m in _marks(spool))
    assert got == [("checkpoint", 500, "epoch 1.50"), ("step", 500, "evaluated")]
