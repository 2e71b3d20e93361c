"""proofcheck.py's plain-Python reference of the method gives exactly the ledger's receipt, byte for byte.

The ledger computes with numpy (vectorised, reordered for speed); the tenant's verifier recomputes with the
standard library. Random runs (tests/proofrun.py) exercise every input a receipt reads; the reference is
given *all* of the ledger's entries, so it also has to select a run's inputs as the ledger does.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.chain import db as db_mod
from ledger import proofcheck as pc
from ledger.chain.canonical import canonical_json
from ledger.chain.entries import Kind, hash_fields
from ledger.method.mig import MIG_SLICES, mig_share
from ledger.method.skus import builtin_table
from ledger.receipts.bundle import _segment_rows
from ledger.receipts import receipt_for
from ledger.receipts.example import KEY, load_example
from ledger.chain.store import iter_entries
from tests import proofrun


def reference_receipt(engine, job: dict) -> dict:  # noqa: ANN001
    entries, samples = [], {}
    with engine.connect() as conn:
        for ce in iter_entries(conn):
            entries.append(pc.parse_leaf(hash_fields(ce.seq, ce.entry, ce.prev_hash), f"seq {ce.seq}"))
            if ce.entry.kind == Kind.TELEMETRY_SEGMENT:
                samples[ce.entry.entry_id] = _segment_rows(conn, ce)
    return pc.compute_receipt(entries, samples, job, {})


def test_the_worked_example(sqlite_url):
    engine = db_mod.make_engine(sqlite_url)
    load_example(engine)
    body = receipt_for(engine, KEY["job_id"]).body
    assert canonical_json(reference_receipt(engine, body["job"])) == canonical_json(body)
    engine.dispose()


@given(st.integers(0, 2**32))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_runs(tmp_path_factory, seed):
    url = f"sqlite:///{tmp_path_factory.mktemp('run') / 'ledger.db'}"
    engine = db_mod.make_engine(url)
    db_mod.upgrade(engine)
    drawn = proofrun.build(engine, seed)
    body = receipt_for(engine, proofrun.JOB, drawn["key"]["run"]).body
    mine = reference_receipt(engine, body["job"])
    assert canonical_json(mine) == canonical_json(body), pc.first_difference(mine, body)
    engine.dispose()


# Seeds whose runs show each part of receipt 1.2, pinned so every run of the suite holds the reference to
# them (the random draws above reach them too, but not on every run). Each is checked to still show its part.
FEATURES = {
    "lost work credited after a provider failure": (14, lambda b: b["billing"]["lost_since_checkpoint_credited"] > 0
                                                     and b["progress"]["lost_since_checkpoint"]["provider_failure"]),
    "a hardware XID the samples show raised ends the run": (
        3, lambda b: b["progress"]["lost_since_checkpoint"]["provider_failure"] == "xid"),
    "an application XID is no provider failure": (
        17, lambda b: b["progress"]["lost_since_checkpoint"]["provider_failure"] is None
        and any(e["what"] == "xid" and e["class"] == "application"
                for e in b["progress"]["lost_since_checkpoint"]["evidence"])),
    "a DCGM job-record interval replaced by samples": (5, lambda b: any(i["replaced_by"]
                                                                          for i in b["unknown_intervals"])),
    "time the job's user controls, held": (32, lambda b: any(i["controlled_by"] == "job_user" and i["policy"] == "hold"
                                                           for i in b["unknown_intervals"])),
    "lost since a checkpoint mark": (1, lambda b: b["progress"]["lost_since_checkpoint"]["from_basis"]
                                     == "checkpoint"),
    "requeued": (9, lambda b: b["progress"]["end_state"] == "REQUEUED"),
    "accounting database's final state": (16, lambda b: b["job"]["accounting"]["source"] == "sacct"),
    "MIG slice at its share": (2, lambda b: any(d.get("mig", {}).get("priced_as", "").startswith("share")
                                                 for d in b["devices"])),
    "MIG profile priced by the contract": (32, lambda b: any(d.get("mig", {}).get("priced_as") == "contract profile"
                                                             for d in b["devices"])),
    "MIG profile not in the table": (4, lambda b: any(d.get("mig", {}).get("priced_as", "").startswith("whole")
                                                       for d in b["devices"])),
    "refused evidence": (3, lambda b: any(i["cause"] == "evidence_refused" for i in b["unknown_intervals"])),
    "period rule end": (13, lambda b: b["contract"].get("period_rule") == "end"),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_each_part_of_the_receipt_is_recomputed_and_bundled(tmp_path, feature):
    from ledger.chain import heads
    from ledger.receipts.bundle import build_bundle, bundle_bytes

    seed, shows = FEATURES[feature]
    engine = db_mod.make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    db_mod.upgrade(engine)
    drawn = proofrun.build(engine, seed)
    receipt = receipt_for(engine, proofrun.JOB, drawn["key"]["run"])
    assert shows(receipt.body), f"seed {seed} no longer draws a run with {feature}"
    mine = reference_receipt(engine, receipt.body["job"])
    assert canonical_json(mine) == canonical_json(receipt.body), pc.first_difference(mine, receipt.body)
    heads.keygen(tmp_path / "k")
    key = heads.load_private_key(tmp_path / "k")
    bundle = build_bundle(engine, proofrun.JOB, drawn["key"]["run"], heads.checkpoint(engine, key))
    assert pc.verify_bundle(bundle_bytes(bundle), key.public_key())["receipt_hash"] == receipt.hash
    engine.dispose()


def test_the_reference_sku_table_is_the_methods():
    assert {k: (r.rated_sm_clock_mhz, r.tdp_w, r.match) for k, r in builtin_table().items()} == pc.SKUS


def test_the_reference_mig_table_is_the_methods():
    assert tuple((key, n) for key, n, _source in MIG_SLICES) == pc.MIG_SLICES
    for profile in ("3g.40gb", "1g.10gb+me", " 7G.80GB ", "8g.90gb", "0g.1gb", "3g", None):
        for sku in ("NVIDIA A100-SXM4-80GB", "NVIDIA A30", "NVIDIA H200", "Acme Tensor 9", None):
            assert pc.mig_share(profile, sku) == mig_share(profile, sku)


def test_np_sum_is_numpys_pairwise_sum():
    import numpy as np

    rng = np.random.default_rng(7)
    for n in (0, 1, 7, 8, 9, 100, 128, 129, 300, 1000):
        xs = rng.random(n) * 10.0 ** rng.integers(-6, 16, n)
        assert pc.np_sum([float(x) for x in xs]) == float(xs.sum())


@given(st.integers(0, 2**32))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_bundle_carries_every_entry_its_receipt_needs(tmp_path_factory, seed):
    """The bundle's selection of entries (run, gaps, resolutions, contract, segments, an open run's latest
    telemetry) is enough: the verifier, given only those, recomputes the ledger's receipt."""
    from ledger.chain import heads
    from ledger.receipts.bundle import build_bundle, bundle_bytes

    d = tmp_path_factory.mktemp("bundle")
    engine = db_mod.make_engine(f"sqlite:///{d / 'ledger.db'}")
    db_mod.upgrade(engine)
    drawn = proofrun.build(engine, seed)
    heads.keygen(d / "k")
    key = heads.load_private_key(d / "k")
    head = heads.checkpoint(engine, key)
    bundle = build_bundle(engine, proofrun.JOB, drawn["key"]["run"], head)
    result = pc.verify_bundle(bundle_bytes(bundle), key.public_key())
    assert result["receipt_hash"] == receipt_for(engine, proofrun.JOB, drawn["key"]["run"]).hash
    engine.dispose()
