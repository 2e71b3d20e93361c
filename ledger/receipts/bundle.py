"""Proof bundles: one self-contained JSON that lets a tenant check a receipt with ``proofcheck.py`` alone.

A bundle holds the receipt as the ledger stood at a signed tree head, that head, every entry the receipt
depends on with its inclusion proof in the head's tree, the rows of every telemetry segment it read, and the
method's version (docs/proofs.md, "Bundle format"). It is written in canonical JSON, the one spelling
``proofcheck.py`` accepts, so no byte of it can change without the check failing.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TYPE_CHECKING


from ..chain import merkle
from ..chain.canonical import canonical_json
from ..chain.entries import ChainedEntry, Kind, hash_fields
from ..chain.heads import HeadError, check_head_against_ledger, recorded_heads
from ..method import METHOD_NAME, METHOD_VERSION
from ..method.skus import SkuRating, builtin_table
from ..proofcheck import BUNDLE_FORMAT, SAMPLE_COLUMNS, load_public_key, samples_digest, segment_columns
from .compute import compute_receipt, run_frame
from .gather import overlapping_entries, gather
from ..telemetry.model import SAMPLE_COLUMNS as LEDGER_SAMPLE_COLUMNS
from ..telemetry.sealed import read_samples

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

assert SAMPLE_COLUMNS == LEDGER_SAMPLE_COLUMNS, "proofcheck.py's sample columns are the ledger's"


def recorded_public_key(conn: Connection, log_id: str) -> Any:
    """The public key recorded with a checkpoint of this log (so a bundle can be made from a head file alone)."""
    for _seq, data in recorded_heads(conn):
        if data.get("log_id") == log_id:
            return load_public_key(str(data.get("public_key", "")).encode(), "recorded tree head")
    raise HeadError(f"no checkpoint of log {log_id} is recorded in this ledger; pass the public key")


def site_ratings(sku_table: Mapping[str, SkuRating] | None) -> dict:
    """The site's SKU ratings that are not the method's built-in ones (they travel in the bundle)."""
    builtin = builtin_table()
    out = {}
    for key, r in (sku_table or {}).items():
        b = builtin.get(key)
        if b is None or (b.rated_sm_clock_mhz, b.tdp_w, b.match) != (r.rated_sm_clock_mhz, r.tdp_w, r.match):
            out[key] = {"rated_sm_clock_mhz": r.rated_sm_clock_mhz, "tdp_w": r.tdp_w, "match": list(r.match)}
    return out


def _segment_rows(conn: Connection, seg: ChainedEntry) -> list[list]:
    """The segment's rows in the columns its entry lists (the base columns, then the format 2 ones it holds)."""
    columns = segment_columns(seg.entry.data.get("columns"))
    table = read_samples(conn, segment_ids=[seg.entry.entry_id], columns=columns)
    rows = sorted(zip(*(table.column(c).to_pylist() for c in columns)), key=operator.itemgetter(0, 1))
    if rows and samples_digest(rows) != seg.entry.data.get("samples_sha256"):
        raise HeadError(f"the samples of segment {seg.entry.entry_id} (entry {seg.seq}) do not match its digest; "
                        f"run `ipledger verify`")
    return [list(r) for r in rows]


class SegmentRows(Mapping):
    """A bundle's ``samples``: segment id -> rows, read from the ledger only when written, one segment at a
    time, so a bundle of a wide run never holds all its rows in memory."""

    def __init__(self, engine: Engine, segments: Mapping[str, ChainedEntry]) -> None:
        self._engine, self._segments = engine, dict(segments)

    def __getitem__(self, segment_id: str) -> list[list]:
        seg = self._segments[segment_id]
        with self._engine.connect() as conn:
            return _segment_rows(conn, seg)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._segments))

    def __len__(self) -> int:
        return len(self._segments)


def build_bundle(engine: Engine, job_id: str, run: int | None, signed_head: Mapping[str, Any], *,
                 cluster: str | None = None, public_key: Any = None,
                 sku_table: Mapping[str, SkuRating] | None = None) -> dict:
    """The bundle of one run's receipt as the ledger stood at ``signed_head`` (checked against the ledger)."""
    with engine.connect() as conn:
        key = public_key if public_key is not None else recorded_public_key(conn, str(signed_head.get("log_id")))
        check_head_against_ledger(conn, signed_head, key, "head")
        size = int(signed_head["tree_size"])
        # the engine, not this connection: samples are then read a batch of devices at a time (bounded memory)
        inputs = gather(engine, str(job_id), run, cluster=cluster, as_of=size)
        receipt = compute_receipt(inputs, sku_table)
        frame = run_frame(inputs.entries, inputs.open_end)
        # the contract the receipt was priced under (its effective dates included)
        contract_ce = next((c for c in inputs.contracts
                            if c.entry.entry_id == receipt.body["contract"]["entry_id"]), None)
        gap_ids = {g.entry.entry_id for g in inputs.gaps} | {
            c.entry.entry_id for c in inputs.entries if c.entry.kind == Kind.UNKNOWN_INTERVAL}
        segments = list(inputs.segments)
        if frame.open and inputs.open_end is not None:  # the segments that set the open run's end
            uuids = {d["uuid"] for d in frame.devices}
            segments += [s for s in overlapping_entries(conn, Kind.TELEMETRY_SEGMENT, frame.start or "",
                                                 "9999-12-31T23:59:59Z", size)
                         if set(s.entry.data.get("devices") or [s.entry.device]) & uuids]
        chosen: dict[int, ChainedEntry] = {}
        for ce in (*inputs.entries, *inputs.gaps, *segments,
                   *(r for r in inputs.resolutions if r.entry.data.get("gap_id") in gap_ids),
                   *([contract_ce] if contract_ce is not None else [])):
            chosen[ce.seq] = ce
        ordered = [chosen[s] for s in sorted(chosen)]
        proofs = merkle.inclusion_proofs(conn, [ce.seq - 1 for ce in ordered], size)
    samples = SegmentRows(engine, {s.entry.entry_id: s for s in segments if s.entry.data.get("rows")})
    return {
        "format": BUNDLE_FORMAT,
        "head": dict(signed_head),
        "method": {"name": METHOD_NAME, "version": METHOD_VERSION, "receipt_version": receipt.body["receipt_version"],
                   "site_skus": site_ratings(sku_table)},
        "receipt": receipt.body,
        "entries": [{"leaf": hash_fields(ce.seq, ce.entry, ce.prev_hash),
                     "proof": [p.hex() for p in proofs[ce.seq - 1]]} for ce in ordered],
        "samples": samples,
    }


def bundle_chunks(bundle: Mapping[str, Any]) -> Iterator[str]:
    """The bundle's canonical JSON and a newline, the only spelling proofcheck.py accepts, in pieces: the
    samples (the last key in sorted order) one segment at a time."""
    head = canonical_json({k: v for k, v in bundle.items() if k != "samples"})
    yield head[:-1] + ',"samples":{'
    for i, (sid, rows) in enumerate(bundle["samples"].items()):
        yield ("," if i else "") + canonical_json(sid) + ":" + canonical_json(rows)
    yield "}}\n"


def bundle_bytes(bundle: Mapping[str, Any]) -> bytes:
    return "".join(bundle_chunks(bundle)).encode("utf-8")


def write_bundle(bundle: Mapping[str, Any], out: str | Path) -> Path:
    p = Path(out)
    with p.open("w", encoding="utf-8") as f:
        for chunk in bundle_chunks(bundle):
            f.write(chunk)
    return p
