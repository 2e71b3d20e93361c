"""Offline verifier of ipledger proofs: a tenant checks a receipt without the operator's database.

One file, the standard library and ``cryptography`` only, so a tenant can copy it alone into any Python 3.11+
environment (docs/proofs.md)::

    python proofcheck.py bundle.json --pubkey site.pub              # a receipt bundle
    python proofcheck.py --consistency c.json --pubkey site.pub     # two signed tree heads of one log

A bundle is checked in this order, and the first thing that fails is named (exit status 1):

1. the bundle is in its one canonical spelling (so no byte of it can change unnoticed);
2. the signed tree head verifies under the public key the tenant holds, and names that key's log; its
   timestamp is an RFC 3339 date-time, and a head of size 0 carries the empty tree's root;
3. every bundled entry is included in that tree (RFC 9162 inclusion proof from its leaf hash);
4. every bundled block of samples hashes to the digest its (included) telemetry segment entry sealed;
5. the receipt recomputed from those entries and samples with the reference implementation of the method
   below (method ``ipledger-attribution`` 1.0.0, receipt 1.2: buckets, a shared device's share (docs/kubernetes.md),
   unknown intervals and who controls each one's evidence, progress marks and the lost work a provider's failure
   credits, the run's accounting state, MIG slice pricing, billing; receipt 1.4 adds the energy block for runs
   priced under a contract naming ``energy_basis``: counter deltas from the sealed ``energy_j`` samples, the power
   integral where the counter froze, unknown with neither) is
   exactly the bundled receipt, and its hash is printed.

The ledger itself uses the hashing, proof and signature functions of this module (``ledger.chain.merkle``), so the
operator's and the tenant's code cannot drift apart. The method below is the method's one plain reference
(docs/method.md, no numpy), in four named stages:

* **frame** -- a run's window, devices and context (:func:`run_frame`), a device's paid window
  (:func:`paid_window`), its sample rows as the figures the method reads (:func:`frame_samples`);
* **attribute** -- one device's integer nanohours per bucket, one sample at a time (:func:`attribute_device`),
  or from a DCGM summary alone (:func:`attribute_summary`); a shared device's share (:func:`scale_account`);
* **price** -- a device's hourly rate (:func:`device_rate`) and its cost per figure (:func:`price_device`);
* **bill** -- unknown time by policy, lost work credited, granularity and minimum (:func:`bill_device`), the
  device line, adjustments, the energy block's totals (:func:`energy_totals`) and the receipt
  (:func:`compute_receipt`).

The package's vectorised attribution (``ledger.method.attribution``, numpy) is held equal to
:func:`attribute_device` under hypothesis (tests/test_method_reference.py) and the whole receipt to
:func:`compute_receipt` byte for byte (tests/test_proofcheck_method.py); every plain scalar part (constants,
intervals, settling, the summary path, shares, progress, pricing, billing, the energy totals, the failure
evidence) the package imports from here instead of writing it again. The direction is one way: this module
imports nothing from ``ledger`` and nothing outside the standard library but ``cryptography``
(tests/test_proofcheck_alone.py runs it as a lone file under ``python -I``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import Any, Callable, Iterable, Mapping, Sequence

BUNDLE_FORMAT = "ipledger-proof-bundle/1"
CONSISTENCY_FORMAT = "ipledger-consistency/1"
HEAD_FORMAT = "ipledger-tree-head/1"
HEAD_DOMAIN = b"ipledger-tree-head-v1\n"  # signed bytes = this prefix + canonical JSON of the four head fields
HEAD_FIELDS = ("log_id", "root_hash", "timestamp", "tree_size")
HASH_DOMAIN = "ipledger-entry-hash-v1"


class Failure(Exception):
    """A check that did not hold; its text names what failed."""


# --- canonical JSON (the one byte form every hash is taken over; same as ledger/chain/canonical.py) ----------------

_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def canonical_json(obj: Any) -> str:
    return _ENCODE(obj)


def sha256_hex(data: str | bytes) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


# --- RFC 9162 Merkle tree hashing and proofs -----------------------------------------------------------------

def leaf_hash(data: bytes) -> bytes:
    """RFC 9162 §2.1.1: SHA-256(0x00 || leaf bytes)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 9162 §2.1.1: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def root_from_inclusion(index: int, size: int, leaf: bytes, path: Sequence[bytes]) -> bytes:
    """RFC 9162 §2.1.3.2: the root an inclusion proof leads to (raises Failure on a malformed proof)."""
    if not 0 <= index < size:
        raise Failure(f"leaf index {index} is outside a tree of size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            raise Failure("inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise Failure("inclusion proof is shorter than the tree is deep")
    return r


def check_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes,
                      proof: Sequence[bytes]) -> None:
    """RFC 9162 §2.1.4.2: the tree of ``new_size`` extends the tree of ``old_size`` (raises Failure)."""
    if old_size > new_size:
        raise Failure(f"old tree size {old_size} is larger than new tree size {new_size}")
    if old_size == new_size:
        if proof or old_root != new_root:
            raise Failure("two heads of the same size with different roots: the log forked")
        return
    if old_size == 0:  # the trivial case: every tree extends the empty one, and that is all it shows
        if old_root != EMPTY_ROOT:
            raise Failure("the old head signs tree size 0 but its root is not the empty tree's (SHA-256 of "
                          "nothing): not a head of any log")
        if proof:
            raise Failure(f"a consistency proof from the empty tree has no hashes; this one has {len(proof)}")
        return
    if not proof:
        raise Failure("empty consistency proof")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise Failure("consistency proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise Failure("consistency proof is shorter than the tree is deep")
    if fr != old_root:
        raise Failure(f"the old head's root does not follow from the proof: entries at or before "
                      f"{old_size} were removed or rewritten")
    if sr != new_root:
        raise Failure("the new head's root does not follow from the proof")


_SECOND = timedelta(seconds=1)
EMPTY_ROOT = hashlib.sha256(b"").digest()  # RFC 9162 §2.1.1: MTH({}) = SHA-256()
_RFC3339 = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,9})?"
                      r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))")


def parse_rfc3339(value: Any, where: str) -> datetime:
    """An RFC 3339 date-time (§5.6: full date, ``T``, time, optional fraction, ``Z`` or a numeric offset),
    every field in range; anything else raises Failure naming ``where``."""
    m = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise Failure(f"{where}: expected an RFC 3339 date-time such as 2026-12-01T14:42:55Z, got "
                      f"{str(value)[:40]!r}")
    y, mo, d, h, mi, sec, frac, _z, sign, oh, om = m.groups()
    try:
        if int(oh or 0) > 23 or int(om or 0) > 59:
            raise ValueError("offset out of range")
        offset = timezone((-1 if sign == "-" else 1) * (int(oh or 0) * 3600 + int(om or 0) * 60) * _SECOND)
        micro = int((frac or ".0")[1:7].ljust(6, "0"))
        return datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), micro, tzinfo=offset)
    except ValueError as exc:
        raise Failure(f"{where}: {value!r} is not a valid RFC 3339 date-time ({exc})") from None


def _hex32(value: Any, where: str) -> bytes:
    if not isinstance(value, str) or len(value) != 64 or value != value.lower():
        raise Failure(f"{where}: expected 64 lowercase hex digits")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise Failure(f"{where}: expected 64 lowercase hex digits") from None


# --- signed tree heads ---------------------------------------------------------------------------------------

def head_message(head: Mapping[str, Any]) -> bytes:
    """The bytes a tree head's signature is over."""
    return HEAD_DOMAIN + canonical_json({k: head[k] for k in HEAD_FIELDS}).encode("utf-8")


def log_id_of(public_key: Any) -> str:
    """A log's id: SHA-256 of its public key's raw 32 bytes (Ed25519), hex."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_hex(raw)


def load_public_key(pem: bytes, where: str = "public key") -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(pem)
    except ValueError as exc:
        raise Failure(f"{where}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise Failure(f"{where}: not an Ed25519 public key")
    return key


def check_head(head: Any, public_key: Any, where: str = "head") -> tuple[int, bytes]:
    """A signed tree head's (tree_size, root) once its shape, log id and signature hold."""
    from cryptography.exceptions import InvalidSignature

    if not isinstance(head, dict):
        raise Failure(f"{where}: not a JSON object")
    want = {"format", "algorithm", "signature", *HEAD_FIELDS}
    if set(head) != want:
        raise Failure(f"{where}: fields {sorted(head)} are not the head's fields {sorted(want)}")
    if head["format"] != HEAD_FORMAT or head["algorithm"] != "ed25519":
        raise Failure(f"{where}: format {head['format']!r} / algorithm {head['algorithm']!r} not understood")
    size = head["tree_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise Failure(f"{where}.tree_size: expected a whole number")
    root = _hex32(head["root_hash"], f"{where}.root_hash")
    if size == 0 and root != EMPTY_ROOT:
        raise Failure(f"{where}: tree_size 0 with a root other than the empty tree's (SHA-256 of nothing)")
    parse_rfc3339(head["timestamp"], f"{where}.timestamp")
    if head["log_id"] != log_id_of(public_key):
        raise Failure(f"{where}.log_id: the head is of log {head['log_id']}, not of the public key given "
                      f"({log_id_of(public_key)})")
    try:
        sig = base64.b64decode(head["signature"], validate=True)
    except (ValueError, TypeError):
        raise Failure(f"{where}.signature: not base64") from None
    if not isinstance(head["signature"], str) or base64.b64encode(sig).decode() != head["signature"]:
        raise Failure(f"{where}.signature: not in canonical base64")
    try:
        public_key.verify(sig, head_message(head))
    except InvalidSignature:
        raise Failure(f"{where}: the signature does not verify under the public key") from None
    return size, root


# --- bundled entries -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """A ledger entry as its leaf bytes spell it (the ledger's canonical chain encoding)."""

    seq: int
    entry_id: str
    kind: str
    ts: str
    ts_end: str | None
    recorded_at: str | None
    cluster: str | None
    job_id: str | None
    run: int | None
    node: str | None
    device: str | None
    payload: str
    source: str
    source_version: str
    prev_hash: str
    hash: str

    @property
    def data(self) -> dict:
        return json.loads(self.payload)


def parse_leaf(text: str, where: str) -> Entry:
    """An entry from its leaf text, once the text is the canonical encoding of a well-formed entry whose
    entry_id is the one its content gives."""
    try:
        f = json.loads(text)
    except ValueError:
        raise Failure(f"{where}: leaf is not JSON") from None
    if not isinstance(f, list) or len(f) != 16 or f[0] != HASH_DOMAIN:
        raise Failure(f"{where}: leaf is not an ipledger entry encoding")
    if canonical_json(f) != text:
        raise Failure(f"{where}: leaf is not in canonical form")
    _, seq, eid, kind, ts, ts_end, rec, cluster, job_id, run, node, device, payload, source, sv, prev = f
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1 or not isinstance(payload, str):
        raise Failure(f"{where}: leaf has no valid seq or payload")
    ident = ["ipledger-entry-id-v1", kind, ts, ts_end, cluster, job_id, run, node, device, payload, source]
    if "e" + sha256_hex(canonical_json(ident))[:39] != eid:
        raise Failure(f"{where}: entry_id {eid} does not match the entry's content")
    return Entry(seq, eid, kind, ts, ts_end, rec, cluster, job_id, run, node, device, payload, source, sv, prev,
                 sha256_hex(text))


# --- the reference method: "ipledger-attribution" 1.0.0, receipt 1.1 (docs/method.md, docs/receipts.md) ------
# Plain Python over the same IEEE-754 doubles, in the same order of operations as the ledger's vectorised
# implementation, so every integer (nanohour) comes out identical.

METHOD_NAME, METHOD_VERSION, RECEIPT_VERSION = "ipledger-attribution", "1.0.0", "1.2"
ENERGY_RECEIPT_VERSION = "1.4"   # 1.4: the energy block, for runs priced under a contract with energy_basis
# 1.5: 1.4 where a device is shared (a MIG slice, a GPU several runs hold): its energy is its share of the GPU's
# (energy_parts); a 1.4 receipt of a shared device billed the whole GPU's and replays so
ENERGY_SHARE_RECEIPT_VERSION = "1.5"
RECEIPT_VERSIONS = (RECEIPT_VERSION, ENERGY_RECEIPT_VERSION, ENERGY_SHARE_RECEIPT_VERSION)
NANOHOURS_PER_SECOND = 1e9 / 3600.0
ACTIVE_MIN, RESIDENT_FB_MIB = 0.05, 512.0
THROTTLE_REASONS = ("thermal", "power_cap", "hw_slowdown", "sync_boost", "other")
BUCKETS = ("delivered", *(f"throttled.{r}" for r in THROTTLE_REASONS), "underutilized", "starved",
           "idle_held", "unknown")
B_DELIVERED, B_UNDER, B_STARVED, B_IDLE, B_UNKNOWN = 0, 6, 7, 8, 9
B_THROTTLED = {r: 1 + i for i, r in enumerate(THROTTLE_REASONS)}
REASON_BITS = (("thermal", 0x20 | 0x40), ("hw_slowdown", 0x8 | 0x80), ("power_cap", 0x4), ("sync_boost", 0x10))
BASE_SAMPLE_COLUMNS = ("device", "t", "dt", "clock_reasons", "sm_active", "sm_occupancy", "tensor_active",
                       "dram_active", "gpu_util", "mem_copy_util", "sm_clock_mhz", "mem_clock_mhz", "power_w",
                       "gpu_temp_c", "mem_temp_c", "energy_j", "ecc_sbe_volatile", "ecc_dbe_volatile",
                       "ecc_sbe_aggregate", "ecc_dbe_aggregate", "row_remap_pending", "row_remap_failure", "xid",
                       "fb_used_mib", "compute_procs")
# Sample block format 2 (docs/ledger.md, "Sample blocks"): columns a segment carries only where it measured
# them (DCGM 1006-1008 FP64/FP32/FP16 pipe active; the floating-point operations AMD's op counters counted in
# the sample's dt). A segment lists its columns in its entry's ``columns``: the 25 above, then those of these
# it holds in this order; its digest and its bundle rows are over its listed columns, so a segment without
# them (every segment before format 2) is sealed, bundled and checked exactly as before.
EXTENSION_COLUMNS = ("fp64_active", "fp32_active", "fp16_active", "fp_ops")
SAMPLE_COLUMNS = (*BASE_SAMPLE_COLUMNS, *EXTENSION_COLUMNS)   # every column a bundle row can carry


def segment_columns(listed: Any, where: str = "columns") -> tuple[str, ...]:
    """A segment entry's ``columns`` checked: absent, the base columns; else the base columns then a subset
    of :data:`EXTENSION_COLUMNS` in their order (anything else is a :class:`Failure` naming ``where``)."""
    if listed is None:
        return BASE_SAMPLE_COLUMNS
    if not isinstance(listed, list) or tuple(listed[:len(BASE_SAMPLE_COLUMNS)]) != BASE_SAMPLE_COLUMNS:
        raise Failure(f"{where}: expected the sample columns {BASE_SAMPLE_COLUMNS[0]}..{BASE_SAMPLE_COLUMNS[-1]}")
    extra = listed[len(BASE_SAMPLE_COLUMNS):]
    if any(c not in EXTENSION_COLUMNS for c in extra) or \
            [EXTENSION_COLUMNS.index(c) for c in extra] != sorted({EXTENSION_COLUMNS.index(c) for c in extra}):
        raise Failure(f"{where}: unknown or repeated sample columns {', '.join(map(str, extra))[:120]}")
    return tuple(listed)


def widen_rows(rows: Sequence[Sequence], columns: Sequence[str]) -> list[list]:
    """Rows in a segment's ``columns`` as rows of every SAMPLE_COLUMNS entry (None where not carried)."""
    if tuple(columns) == SAMPLE_COLUMNS:
        return [list(r) for r in rows]
    at = [columns.index(c) if c in columns else -1 for c in SAMPLE_COLUMNS]
    return [[None if i < 0 else r[i] for i in at] for r in rows]


# The method's SKU ratings (ledger/method/skus.toml): key -> (rated SM clock MHz, TDP W, match patterns).
SKUS: dict[str, tuple[float, float, tuple[str, ...]]] = {
    "A100-SXM4-40GB": (1410.0, 400.0, ("A100-SXM4-40GB", "A100 SXM4 40GB", "A100-SXM-40GB")),
    "A100-SXM4-80GB": (1410.0, 400.0, ("A100-SXM4-80GB", "A100 SXM4 80GB", "A100-SXM-80GB", "A100 80GB")),
    "H100-SXM5-80GB": (1980.0, 700.0, ("H100 80GB HBM3", "H100-SXM5", "H100 SXM5", "H100 SXM", "H100-SXM")),
    "H100-PCIE-80GB": (1755.0, 350.0, ("H100 PCIe", "H100-PCIE", "H100 NVL")),
    "H200-141GB": (1980.0, 700.0, ("H200",)),
    "B200-180GB": (1965.0, 1000.0, ("B200",)),
    "GB200": (2062.0, 1200.0, ("GB200",)),
    "L40S": (2520.0, 350.0, ("L40S",)),
    "MI250X": (1700.0, 560.0, ("MI250X",)),
    "MI300X": (2100.0, 750.0, ("MI300X",)),
    "MI325X": (2100.0, 1000.0, ("MI325X",)),
}


def to_epoch(ts: str) -> float:
    s = ts.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    value = datetime.fromisoformat(s)
    if value.tzinfo is None:
        raise Failure(f"timestamp without a timezone: {ts!r}")
    return value.astimezone(timezone.utc).timestamp()


def format_ts(epoch: float) -> str:
    value = datetime.fromtimestamp(epoch, tz=timezone.utc)
    out = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        out += f".{value.microsecond:06d}".rstrip("0")
    return out + "Z"


def to_nanohours(seconds: float) -> int:
    return int(round(seconds * NANOHOURS_PER_SECOND))


def hours(nanohours: int) -> float:
    return int(nanohours) / 1e9


def in_order_sum(values: Iterable[float], start: float = 0) -> float:
    """``start`` plus the values added one at a time, left to right: the order of additions every energy sum
    of the method uses. It is what Python 3.11's ``sum()`` does, spelled out because 3.12's ``sum()`` adds floats
    with compensation (a different last bit). The package's fast path over arrays
    (``ledger.method.energy_arrays.array_in_order_sum``) is held equal to it bit for bit."""
    acc = start
    for v in values:
        acc = acc + v
    return acc


def np_sum(xs: Sequence[float]) -> float:
    """numpy's pairwise summation of float64, step for step (the ledger sums a few overlaps this way)."""
    n = len(xs)
    if n < 8:
        r = 0.0
        for x in xs:
            r += x
        return r
    if n <= 128:
        acc = list(xs[:8])
        i = 8
        while i < n - n % 8:
            for j in range(8):
                acc[j] += xs[i + j]
            i += 8
        r = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
        for x in xs[i:]:
            r += x
        return r
    half = n // 2
    half -= half % 8
    return np_sum(xs[:half]) + np_sum(xs[half:])


def union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted((a, b) for a, b in spans if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def subtract(span: tuple[float, float], minus: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    a, b = span
    out, cur = [], a
    for x, y in minus:
        if y <= cur or x >= b:
            continue
        if x > cur:
            out.append((cur, x))
        cur = max(cur, y)
        if cur >= b:
            break
    if cur < b:
        out.append((cur, b))
    return out


class Spans:
    """Sorted disjoint spans and their cumulative measure: |[a, b) ∩ spans| as the ledger computes it."""

    def __init__(self, starts: Sequence[float], ends: Sequence[float]) -> None:
        import bisect

        self.starts, self.ends, self._right = list(starts), list(ends), bisect.bisect_right
        self.cum = [0.0]
        for x, y in zip(self.starts, self.ends):
            self.cum.append(self.cum[-1] + (y - x))

    def _f(self, x: float) -> float:
        i = self._right(self.starts, x)
        j = max(i - 1, 0)
        inside = min(max(x - self.starts[j], 0.0), self.ends[j] - self.starts[j]) if i > 0 else 0.0
        return self.cum[j] + inside

    def overlap(self, a: float, b: float) -> float:
        if not self.starts:
            return 0.0
        return max(self._f(b) - self._f(a), 0.0)


def gap_spans(window: tuple[float, float], susp: Sequence[tuple[float, float]],
              unknown: Sequence[tuple[float, float, str]]) -> dict[str, list[tuple[float, float]]]:
    """Each gap's exclusive spans inside the window: minus suspended time, minus what earlier gaps (in the
    given ledger order) already took, so overlapping gaps are never counted twice."""
    s, e = window
    taken = list(susp)
    spans: dict[str, list[tuple[float, float]]] = {}
    for a, b, gid in unknown:
        span = (max(a, s), min(b, e))
        spans.setdefault(gid, [])
        if span[1] <= span[0]:
            continue
        free = subtract(span, union(taken))
        spans[gid].extend(free)
        taken.extend(free)
    return spans


def gap_portions(window: tuple[float, float], susp: list[tuple[float, float]],
                 unknown: Sequence[tuple[float, float, str]],
                 measured: Spans | None = None) -> tuple[dict[str, int], list[tuple[float, float]]]:
    """(nanohours per gap, union of all gap spans); a gap yields to the ``measured`` spans of samples."""
    spans = gap_spans(window, susp, unknown)
    portions = {}
    for gid, sp in spans.items():
        secs = math.fsum(b - a for a, b in sp)
        if measured is not None and sp:
            secs -= np_sum([measured.overlap(a, b) for a, b in sp])
        portions[gid] = to_nanohours(max(secs, 0.0))
    return portions, union([x for sp in spans.values() for x in sp])


def settle(paid_nanohours: int, buckets: list[int], gap_total: int) -> tuple[list[int], int]:
    """Uncovered time (no sample, no gap) is unknown; per-sample rounding residue lands there too. If rounding
    made the parts exceed paid (by a few nanohours), the excess is taken from the largest bucket (the first
    of equals). Returns (buckets, uncovered nanohours)."""
    rest = paid_nanohours - sum(buckets) - gap_total
    if rest < 0:
        buckets = list(buckets)
        while rest < 0:
            k = max(range(len(buckets)), key=lambda i: (buckets[i], -i))
            take = min(-rest, buckets[k])
            if take == 0:
                break
            buckets[k] -= take
            rest += take
        rest = max(rest, 0)
    return buckets, rest


@dataclass
class Account:
    paid_nanohours: int
    buckets: list[int]
    suspended_nanohours: int
    gap_nanohours: dict[str, int]
    causes: dict[str, int]
    fidelity: str
    coarse_nanohours: int = 0


def finish_account(paid_nanohours: int, suspended_nanohours: int, portions: dict[str, int], buckets: list[int], fidelity: str,
                   coarse_nanohours: int = 0) -> Account:
    """From a device's integer sums per bucket (unknown holding only field_missing) to its account: settle the
    rounding residue, then split unknown by cause (``ledger.method.attribution`` ends its vectorised pass here)."""
    gap_total = sum(portions.values())
    buckets, uncovered = settle(paid_nanohours, buckets, gap_total)
    causes = {"field_missing": buckets[B_UNKNOWN], "no_telemetry": uncovered}
    buckets[B_UNKNOWN] += uncovered + gap_total
    return Account(paid_nanohours, buckets, suspended_nanohours, portions, causes, fidelity, coarse_nanohours)


def paid_window(window: tuple[float, float], suspended: Sequence[tuple[float, float]]
                ) -> tuple[float, float, list[tuple[float, float]], int, int]:
    """Stage "frame" of one device's window: (start, end, its suspended spans merged, paid nanohours, suspended
    nanohours); paid is the window minus its suspended time (a window that ends before it starts is empty)."""
    s, e = float(window[0]), float(window[1])
    e = max(e, s)
    susp = union((max(a, s), min(b, e)) for a, b in suspended if min(b, e) > max(a, s))
    paid_nanohours = to_nanohours(e - s - math.fsum(b - a for a, b in susp))
    return s, e, susp, paid_nanohours, to_nanohours(e - s) - paid_nanohours


def reason_index(mask: int) -> int:
    if mask < 0:
        return THROTTLE_REASONS.index("other")
    code = (mask >> 2) & 63
    for name, bits in REASON_BITS:
        if (code << 2) & bits:
            return THROTTLE_REASONS.index(name)
    return THROTTLE_REASONS.index("other")


FLOAT_MAX = sys.float_info.max


def _finite(x: float) -> float:
    """A not-a-number as 0 and an infinity as the largest float, so a sample's end stays a number."""
    if x != x:
        return 0.0
    return max(-FLOAT_MAX, min(x, FLOAT_MAX))


def frame_samples(rows: Sequence[Sequence]) -> list[tuple]:
    """Stage "frame" of one device's samples: bundle rows (SAMPLE_COLUMNS order, None = not measured) to the
    figures the method reads, one tuple per sample: (t, dt, activity, coarse, sm clock, clock-event mask,
    compute processes, framebuffer MiB), NaN = not measured, mask -1 = not measured. Activity is the best
    signal: SM active, else tensor active, else the coarse gpu_util (``coarse`` then True)."""
    col = {name: i for i, name in enumerate(SAMPLE_COLUMNS)}
    nan = float("nan")
    out = []
    for r in rows:
        def get(name: str, r: Sequence = r) -> float:
            v = r[col[name]]
            return nan if v is None else float(v)

        sm, ten, gu = get("sm_active"), get("tensor_active"), get("gpu_util")
        fine = ten if sm != sm else sm
        mask = r[col["clock_reasons"]]
        out.append((get("t"), get("dt"), gu if fine != fine else fine, fine != fine and gu == gu,
                    get("sm_clock_mhz"), -1 if mask is None else int(mask), get("compute_procs"),
                    get("fb_used_mib")))
    return out


def attribute_device(window: tuple[float, float], samples: Sequence[tuple], unknown: Sequence[tuple] = (),
                     suspended: Sequence[tuple[float, float]] = (), rated: float | None = None,
                     active_min: float = ACTIVE_MIN, resident_fb_mib: float = RESIDENT_FB_MIB) -> Account:
    """Stage "attribute": one device's allocated window [start, end) in integer nanohours per bucket, one sample
    at a time (docs/method.md, "Per sample"), from :func:`frame_samples` tuples in any order (a stable sort by
    time first). This is the method's plain reference: tests hold ``ledger.method.attribute_device`` (numpy)
    equal to it under hypothesis, integer for integer."""
    s, e, susp, paid_nanohours, suspended_nanohours = paid_window(window, suspended)
    if not samples:
        portions, _ = gap_portions((s, e), susp, unknown)
        buckets = [0] * len(BUCKETS)
        buckets[B_UNKNOWN] = paid_nanohours
        return Account(paid_nanohours, buckets, suspended_nanohours, portions,
                       {"field_missing": 0, "no_telemetry": paid_nanohours - sum(portions.values())}, "none")
    rows = sorted(samples, key=lambda r: r[0])
    if any(r[0] != r[0] for r in rows):
        raise Failure("a sample's time is not a number")
    t = [r[0] for r in rows]
    n = len(t)
    # Each sample covers [t, min(t + dt, next t)) clipped to the window.
    b = [t[i] + _finite(rows[i][1]) for i in range(n)]
    for i in range(n - 1):
        b[i] = min(b[i], t[i + 1])
    b = [min(max(x, s), e) for x in b]
    a = [min(max(x, s), e) for x in t]
    covered = [max(y - x, 0.0) for x, y in zip(a, b)]
    present = [r[2] == r[2] for r in rows]
    # Unknown intervals: each gap's share, minus the time samples with a measured activity cover.
    measured = None
    if unknown:
        has = [i for i in range(n) if present[i] and covered[i] > 0]
        measured = Spans([a[i] for i in has], [b[i] for i in has])
    portions, gaps = gap_portions((s, e), susp, unknown, measured)
    if susp:                                   # suspended time is not paid
        sp = Spans([x for x, _ in susp], [y for _, y in susp])
        covered = [c - sp.overlap(x, y) for c, x, y in zip(covered, a, b)]
    if gaps:                                   # a sample without activity yields to a gap
        gp = Spans([x for x, _ in gaps], [y for _, y in gaps])
        covered = [c if present[i] else c - gp.overlap(a[i], b[i]) for i, c in enumerate(covered)]
    if susp or gaps:
        covered = [max(c, 0.0) for c in covered]
    sums = [0] * len(BUCKETS)
    coarse_nanohours = 0
    for i, (_t, _dt, act, coarse, clock, mask, procs, fb) in enumerate(rows):
        activity = min(max(act, 0.0), 1.0) if present[i] else 0.0
        fb_seen = fb if resident_fb_mib >= 0 else _finite(fb)   # a negative threshold: unmeasured fb is 0
        resident = procs > 0.0 or fb_seen > resident_fb_mib
        low = present[i] and activity < active_min
        working = present[i] and not low
        busy = covered[i] * activity
        cov = int(covered[i] * NANOHOURS_PER_SECOND + 0.5)   # rounded once; the parts are split from this integer
        active = int(busy * NANOHOURS_PER_SECOND + 0.5)
        if rated:                               # clock ratio r = min(clock / rated, 1); unmeasured: 1
            ratio = clock / float(rated)
            ratio = max(1.0 if ratio != ratio else min(ratio, 1.0), 0.0)
            delivered = int(busy * ratio * NANOHOURS_PER_SECOND + 0.5)
        else:
            delivered = active
        active = min(active, cov) if working else 0
        delivered = min(delivered, active)
        if active - delivered:
            sums[B_THROTTLED[THROTTLE_REASONS[reason_index(mask)]]] += active - delivered
        sums[B_DELIVERED] += delivered
        if working:
            sums[B_UNDER] += cov - active
        if low:
            sums[B_STARVED if resident else B_IDLE] += cov
        if not present[i]:
            sums[B_UNKNOWN] += cov             # unknown, cause field_missing: never read as zero
        elif coarse:
            coarse_nanohours += cov
    return finish_account(paid_nanohours, suspended_nanohours, portions, sums, "samples", coarse_nanohours)


def attribute_samples(window: tuple[float, float], rows: Sequence[Sequence], unknown: Sequence[tuple],
                      suspended: Sequence[tuple[float, float]], rated: float | None) -> Account:
    """One device's buckets from its bundled sample rows: :func:`frame_samples`, then :func:`attribute_device`."""
    return attribute_device(window, frame_samples(rows), unknown, suspended, rated)


def _flatten(d: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = prefix + "".join(ch for ch in str(k).lower() if ch.isalnum())
        if isinstance(v, Mapping):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _pick(flat: Mapping[str, Any], *candidates: str) -> float | None:
    """First numeric value whose normalised key equals a candidate, else one that ends with it."""
    for c in candidates:
        if c in flat and _num(flat[c]) is not None:
            return _num(flat[c])
    for c in candidates:
        for k in sorted(flat):
            if k.endswith(c) and _num(flat[k]) is not None:
                return _num(flat[k])
    return None


def summary_fields(payload: Mapping[str, Any]) -> dict[str, float | None]:
    """The few DCGM job-stats figures the method uses, tolerant of how the adapter spelled the keys:
    percentages stay percentages (0-100); None means the summary did not carry a number for it."""
    flat = _flatten(payload)
    return {
        "util": _pick(flat, "smutilpctavg", "smutilizationavg", "smutilavg", "smutilization", "avgsmutilization",
                      "smutilpct", "gfxactivityavg", "gfxactivity"),
        "clock": _pick(flat, "smclockmhzavg", "smclockavg", "smclockmhz", "smclock", "gfxclockavg"),
        "power": _pick(flat, "slowdownpowerpct", "slowdownpower", "violationpowerpct", "powerviolationpct",
                       "powerpct", "power"),
        "thermal": _pick(flat, "slowdownthermalpct", "slowdownthermal", "violationthermalpct",
                         "thermalviolationpct", "thermalpct", "thermal"),
        "sync_boost": _pick(flat, "slowdownsyncboostpct", "slowdownsyncboost", "violationsyncboostpct",
                            "syncboostpct", "syncboost"),
        "board": _pick(flat, "slowdownboardlimitpct", "slowdownboardlimit", "violationboardlimitpct",
                       "boardlimitpct", "boardlimit"),
        "reliability": _pick(flat, "slowdownreliabilitypct", "slowdownreliability", "violationreliabilitypct",
                             "reliabilitypct", "reliability"),
        "processes": _pick(flat, "numprocesses", "noofprocesses", "processes", "processcount"),
    }


def largest_remainder(total: int, weights: Sequence[float]) -> list[int]:
    """Split an integer total by weights; leftovers go to the largest fractional parts (ties: first)."""
    s = math.fsum(weights)
    if total <= 0 or s <= 0:
        return [0] * len(weights)
    raw = [total * w / s for w in weights]
    base = [int(math.floor(x)) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - base[i]), i))
    for i in order[:total - sum(base)]:
        base[i] += 1
    return base


def attribute_summary(window: tuple[float, float], payload: Mapping[str, Any], unknown: Sequence[tuple],
                      suspended: Sequence[tuple[float, float]], rated: float | None,
                      active_min: float = ACTIVE_MIN) -> Account:
    """Stage "attribute" of a device with no samples but its DCGM job-stats summary: the summary's averages
    spread over the covered time by largest remainders (``ledger.method.attribute_summary`` is this, plus the
    PDF's timeline strip)."""
    s, e, susp, paid_nanohours, suspended_nanohours = paid_window(window, suspended)
    portions, _ = gap_portions((s, e), susp, unknown)
    covered = max(paid_nanohours - sum(portions.values()), 0)
    f = summary_fields(payload)
    buckets = [0] * len(BUCKETS)
    if f["util"] is None:
        buckets[B_UNKNOWN] = covered
    else:
        act = min(max(f["util"] / 100.0, 0.0), 1.0)
        clk = f["clock"]
        ratio = 1.0 if not (clk and rated) else min(max(clk / rated, 0.0), 1.0)
        procs = f["processes"]
        if act < active_min:
            resident = procs is None and act > 0 or (procs or 0) > 0
            buckets[B_STARVED if resident else B_IDLE] = covered
        else:
            d, thr, under = largest_remainder(covered, [act * ratio, act * (1 - ratio), 1 - act])
            buckets[B_DELIVERED], buckets[B_UNDER] = d, under
            w = [f["thermal"] or 0.0, 0.0, f["power"] or 0.0, f["sync_boost"] or 0.0,
                 (f["board"] or 0.0) + (f["reliability"] or 0.0)]
            if sum(w) <= 0:
                w = [0, 0, 0, 0, 1.0]
            for name, part in zip(["thermal", "hw_slowdown", "power_cap", "sync_boost", "other"],
                                  largest_remainder(thr, w)):
                buckets[B_THROTTLED[name]] = part
    return finish_account(paid_nanohours, suspended_nanohours, portions, buckets, "summary")


def match_sku(name: str | None, table: Mapping[str, tuple]) -> str | None:
    if not name:
        return None
    if name in table:
        return name
    low, best = name.lower(), None
    for key in sorted(table):
        for pat in (key, *table[key][2]):
            if pat and pat.lower() in low and (best is None or len(pat) > best[0]):
                best = (len(pat), key)
    return None if best is None else best[1]


# --- contracts and money ------------------------------------------------------------------------------------

CENT, NANOHOURS, HOURS_PER_YEAR = Decimal("0.01"), Decimal(10) ** 9, Decimal(8760)
DEFAULT_CONTRACT = {"id": "ipledger-default", "version": "1", "currency": "USD", "accounts": [],
                    "billing_granularity_s": 1, "billing_minimum_s": 0, "charge_suspended": False,
                    "unknown_policy": "hold", "skus": {"default": {"rate_per_gpu_hour": "1.00"}}}


def hourly(basis: Mapping[str, Any], tdp_w: float | None) -> Decimal:
    if "rate_per_gpu_hour" in basis:
        return Decimal(str(basis["rate_per_gpu_hour"]))
    price, years = Decimal(str(basis["capex_price"])), Decimal(str(basis["capex_years"]))
    residual = Decimal(str(basis.get("capex_residual", 0)))
    amort = (price - residual) / (years * HOURS_PER_YEAR)
    energy = (Decimal(str(tdp_w or 0)) / Decimal(1000) * Decimal(str(basis.get("pue", 1)))
              * Decimal(str(basis.get("energy_price_per_kwh", 0))))
    return amort + energy


def basis_for(contract: Mapping[str, Any], key: str | None) -> Mapping[str, Any]:
    skus = contract.get("skus") or {}
    if key and key in skus:
        return skus[key]
    return skus.get("default", {"rate_per_gpu_hour": "0"})


def money(x: Decimal) -> Decimal:
    return (x / NANOHOURS).quantize(CENT, rounding=ROUND_HALF_EVEN)


def share_of(bound: Mapping) -> tuple[str, Fraction] | None:
    """A shared device's (rule, share) from its device_bound payload (docs/kubernetes.md, "Shared GPUs")."""
    sharers = bound.get("sharers")
    if not isinstance(sharers, int) or isinstance(sharers, bool) or sharers < 2:
        return None
    for rule in ("declared", "measured"):
        text = bound.get(f"{rule}_share")
        if isinstance(text, str):
            try:
                f = Fraction(text)
            except (ValueError, ZeroDivisionError):
                continue
            if 0 < f <= 1:
                return rule, f
    return "equal", Fraction(1, sharers)


def scale_account(acc: Account, share: Fraction) -> Account:
    """The run's share of a device account: buckets floor(b × share), largest remainders topped up to
    floor(paid × share); gaps, causes, suspended and coarse time floor(x × share)."""
    num, den = share.numerator, share.denominator
    paid = acc.paid_nanohours * num // den
    raw = [b * num for b in acc.buckets]
    out = [r // den for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] % den), i))[:max(paid - sum(out), 0)]:
        out[i] += 1
    return Account(paid, out, acc.suspended_nanohours * num // den, {g: v * num // den for g, v in acc.gap_nanohours.items()},
                   {c: v * num // den for c, v in acc.causes.items()}, acc.fidelity, acc.coarse_nanohours * num // den)


def sum_accounts(parts: Sequence[Account], fidelity: str) -> Account:
    """Accounts added, in integer nanohours: a device's over adjacent parts of its window, or a run's devices
    into the run's totals (no parts: all zero)."""
    gap_nanohours: dict[str, int] = {}
    causes: dict[str, int] = {}
    for p in parts:
        for g, v in p.gap_nanohours.items():
            gap_nanohours[g] = gap_nanohours.get(g, 0) + v
        for c, v in p.causes.items():
            causes[c] = causes.get(c, 0) + v
    buckets = [sum(x) for x in zip(*(p.buckets for p in parts))] if parts else [0] * len(BUCKETS)
    return Account(sum(p.paid_nanohours for p in parts), buckets,
                   sum(p.suspended_nanohours for p in parts), gap_nanohours, causes, fidelity, sum(p.coarse_nanohours for p in parts))


def billed_nanohours(nanohours: int, gran_s: int, min_s: int, paid_nanohours: int) -> int:
    if nanohours <= 0:
        return 0
    units = -((-nanohours * 3600) // (gran_s * 10**9))
    rounded = (units * gran_s * 10**9 + 1800) // 3600
    return max(rounded, to_nanohours(min_s)) if paid_nanohours > 0 else rounded


POLICIES = ("charge", "credit", "estimate", "hold")   # how unknown time is billed (docs/receipts.md)


def bill_device(acc: Account, gaps: Sequence[tuple[float, float, str]], gap_policy: Mapping[str, str],
                default_policy: str, charge_suspended: bool, credited_span: tuple[float, float] | None,
                suspended: Sequence[tuple[float, float]], gran_s: int, min_s: int) -> tuple[dict[str, int], int, int]:
    """Stage "bill" of one device: (its unknown nanohours by policy, the lost work credited, nanohours billed).

    Unknown time goes to its gap's policy (unattributed unknown to the contract's); credit and hold are not
    billed; suspended time is billed only if the contract says so; a provider's failure credits the work lost
    since the last saved mark, less what is already unbilled; then granularity and minimum."""
    unknown_by = {p: 0 for p in POLICIES}
    for gid, v in acc.gap_nanohours.items():
        unknown_by[gap_policy.get(gid, default_policy)] += v
    unknown_by[default_policy] += int(acc.buckets[-1]) - sum(acc.gap_nanohours.values())
    billable = acc.paid_nanohours - unknown_by["credit"] - unknown_by["hold"]
    if charge_suspended:
        billable += acc.suspended_nanohours
    lost = 0
    if credited_span is not None:  # the lost work, less what is already unbilled (suspended, credit/hold)
        not_billed = [(a, b) for a, b, gid in gaps if gap_policy.get(gid, default_policy) in ("credit", "hold")]
        lost = min(to_nanohours(seconds_of(cut(credited_span, [*suspended, *not_billed]))), max(billable, 0))
        billable -= lost
    return unknown_by, lost, billed_nanohours(billable, gran_s, min_s, acc.paid_nanohours)


def price_device(cost: dict[str, Decimal], acc: Account, billed: int, rate: Decimal) -> None:
    """Stage "price" of one device: its paid, billed, suspended and per-bucket nanohours at its hourly rate,
    added into ``cost`` (nanohours x rate, exact Decimals; :func:`money` rounds each figure to cents once)."""
    cost["paid"] += acc.paid_nanohours * rate
    cost["billed"] += billed * rate
    cost["suspended"] += acc.suspended_nanohours * rate
    for name, v in zip(BUCKETS, acc.buckets):
        cost[name] += int(v) * rate


def device_line(dev: Mapping[str, Any], sku_rating: str | None, acc: Account, billed: int, rate: Decimal,
                mig: dict | None, window_start: float, device_paid_nanohours: int | None) -> dict:
    """One device's line on the receipt. ``mig`` only on MIG slices and ``share`` only on shared devices, so
    receipts of whole GPUs held alone keep their bytes: under changing sharers the share from each instant on
    (``dev["segments"]``), else the one share (``dev["shared"]``)."""
    line = {"uuid": dev["uuid"], "node": dev["node"], "index": dev["index"], "sku": dev["sku"],
            "sku_rating": sku_rating, "fidelity": acc.fidelity,
            "gpu_hours": hours_block(acc.buckets, acc.paid_nanohours, acc.suspended_nanohours),
            "billed_gpu_hours": hours(billed), "rate": str(rate)}
    if mig is not None:
        line["mig"] = mig
    if dev.get("segments"):
        line["share"] = {"rule": "segments", "segments": [
            {"from": format_ts(max(t0, window_start)), "rule": sh[0] if sh else "whole",
             "ratio": f"{sh[1].numerator}/{sh[1].denominator}" if sh else "1/1"} for t0, sh in dev["segments"]],
            "device_paid_gpu_hours": hours(device_paid_nanohours)}
    elif dev.get("shared") is not None:
        rule, share = dev["shared"]
        line["share"] = {"rule": rule, "ratio": f"{share.numerator}/{share.denominator}",
                         "device_paid_gpu_hours": hours(device_paid_nanohours)}
    return line


def adjustments_block(adjustments: Iterable[Any], mean_rate: Decimal) -> tuple[list[dict], Decimal, int]:
    """The receipt's adjustment lines from the run's ``adjustment`` entries (anything with ``entry_id``, ``ts``
    and ``data``), with their signed total amount and signed nanohours: hours are priced at the run's mean rate."""
    lines, total, adj_nanohours = [], Decimal(0), 0
    for e in adjustments:
        d = e.data
        sign = Decimal(1) if d.get("direction") == "debit" else Decimal(-1)
        if "hours" in d:
            h = Decimal(str(d["hours"]))
            amount = (h * mean_rate).quantize(CENT, rounding=ROUND_HALF_EVEN)
            adj_nanohours += int(sign) * int((h * NANOHOURS).to_integral_value(rounding=ROUND_HALF_EVEN))
        else:
            h = None
            amount = Decimal(str(d["amount"])).quantize(CENT)
        total += sign * amount
        lines.append({"id": e.entry_id, "direction": d.get("direction"),
                      "gpu_hours": None if h is None else float(h), "amount": float(amount),
                      "reason": d.get("reason"), "by": d.get("by"), "ts": e.ts,
                      "references": d.get("references", [])})
    return lines, total, adj_nanohours


def estimated_delivered(estimate_nanohours: int, delivered_nanohours: int, paid_nanohours: int, unknown_nanohours: int) -> int:
    """Nanohours of the unknown time under the ``estimate`` policy that the known time's delivered share
    suggests were delivered (integer, half up)."""
    known = paid_nanohours - unknown_nanohours
    if estimate_nanohours and known > 0:
        return (estimate_nanohours * delivered_nanohours + known // 2) // known
    return 0


# MIG: an instance is priced at the share of its parent GPU its profile's compute slices hold
# (ledger/method/mig.py): product name fragment -> compute slices of the whole GPU, first match wins.
MIG_SLICES = (("A30", 4), ("A100", 7), ("H100", 7), ("H200", 7), ("B200", 7))
MIG_PROFILE = re.compile(r"^(\d)g\.\d+gb(\+me)?$")


def mig_share(profile: str | None, sku: str | None) -> Fraction | None:
    m = MIG_PROFILE.match((profile or "").strip().lower())
    total = next((n for key, n in MIG_SLICES if key in sku.upper()), None) if sku else None
    if m is None or total is None or not 0 < int(m.group(1)) <= total:
        return None
    return Fraction(int(m.group(1)), total)


def device_rate(contract: Mapping[str, Any], key: str | None, tdp_w: float | None,
                dev: Mapping[str, Any]) -> tuple[Decimal, str, dict | None]:
    """(hourly rate, its key in the receipt's rate table, the device line's ``mig`` block or None)."""
    skus = contract.get("skus") or {}
    return rate_of(key, dev, lambda: hourly(basis_for(contract, key), tdp_w),
                   lambda name: None if name not in skus else hourly(skus[name], tdp_w))


def rate_of(key: str | None, dev: Mapping[str, Any], whole_rate: Callable[[], Decimal],
            named_rate: Callable[[str], Decimal | None]) -> tuple[Decimal, str, dict | None]:
    """Stage "price" of one device's hour: (rate, its key in the receipt's rate table, the ``mig`` block or None).

    ``whole_rate()`` is the contract's rate for the SKU ``key`` (else its default); ``named_rate(name)`` the rate
    of a price the contract names exactly, or None. A MIG instance pays the contract's price for its profile
    (``<SKU key>/<profile>``) when there is one, else the whole GPU's rate times the share of compute slices
    its profile holds; a profile the MIG table does not know is billed as a whole GPU, and says so."""
    profile = dev.get("mig_profile")
    if not profile:
        return whole_rate(), key or "unrated", None
    share = mig_share(profile, dev.get("sku"))
    mig = {"gpu_uuid": dev.get("gpu_uuid"), "gpu_instance": dev.get("mig_instance"), "profile": profile,
           "share": None if share is None else f"{share.numerator}/{share.denominator}"}
    priced = named_rate(f"{key}/{profile}") if key else None
    if priced is not None:
        mig["priced_as"] = "contract profile"
        return priced, f"{key}/{profile}", mig
    whole = whole_rate()
    if share is None:
        mig["priced_as"] = "whole GPU (profile not in the MIG table)"
        return whole, key or "unrated", mig
    mig["priced_as"] = "share of the whole GPU's rate"
    rate = (whole * share.numerator / share.denominator).quantize(Decimal("1e-12"), rounding=ROUND_HALF_EVEN)
    return rate, f"{key or 'unrated'}/{profile}", mig


# --- energy (receipt 1.4; ledger/method/energy.py and ledger/receipts/energy.py) -----------------------------
# A device's energy from its energy_j counter (joules, as stored) and power_w: counter deltas span by span,
# resets and wraps bridged, a frozen counter replaced by the power integral, no counter and no power unknown.

J_PER_KWH = 3_600_000.0


def power_integral(power: Sequence[tuple[float, float]], start: float, end: float,
                   max_gap_s: float = 300.0) -> tuple[float, float]:
    joules = covered = 0.0
    for (at, aw), (bt, bw) in zip(power, power[1:]):
        if bt <= at or bt - at > max_gap_s or bt <= start or at >= end:
            continue
        lo, hi = max(at, start), min(bt, end)
        slope = (bw - aw) / (bt - at)
        w_lo, w_hi = aw + slope * (lo - at), aw + slope * (hi - at)
        joules += (w_lo + w_hi) / 2 * (hi - lo)
        covered += hi - lo
    return joules, covered


def _power_span(power, start, end, cause, max_gap_s) -> list[tuple]:  # noqa: ANN001
    """(start, end, joules or None, source, cause) spans of [start, end] from power alone."""
    if end <= start:
        return []
    j, cov = power_integral(power, start, end, max_gap_s)
    if cov <= 0:
        return [(start, end, None, "unknown", f"{cause}+no_power" if cause else "no_power")]
    if cov >= (end - start) * (1 - 1e-9):
        return [(start, end, j, "power_integral", cause)]
    mid = start + cov
    return [(start, mid, j, "power_integral", cause),
            (mid, end, None, "unknown", f"{cause}+power_gap" if cause else "power_gap")]


def device_energy(readings: Sequence[tuple[float, float]], start: float, end: float,
                  power: Sequence[tuple[float, float]], frozen_min_w: float = 5.0,
                  max_gap_s: float = 300.0) -> list[tuple]:
    """The spans of one device's energy over [start, end] (counter readings in J, no modulus)."""
    rs = sorted((r for r in readings if start <= r[0] <= end), key=lambda r: r[0])
    ps = sorted(power, key=lambda p: p[0])
    if not rs:
        return _power_span(ps, start, end, "no_counter", max_gap_s)
    spans = _power_span(ps, start, rs[0][0], "before_first_reading", max_gap_s)
    for (at, ja), (bt, jb) in zip(rs, rs[1:]):
        if bt <= at:
            continue
        delta, cause = jb - ja, ""
        if delta < 0:
            delta, cause = jb, "counter_reset"
        if delta == 0:
            pj, cov = power_integral(ps, at, bt, max_gap_s)
            if cov > 0 and pj / cov > frozen_min_w:
                spans += _power_span(ps, at, bt, "frozen_counter", max_gap_s)
                continue
        spans.append((at, bt, delta, "counter", cause))
    return spans + _power_span(ps, rs[-1][0], end, "after_last_reading", max_gap_s)


def _spans_source(spans: Sequence[tuple]) -> str:
    kinds = {s[3] for s in spans if s[1] > s[0]}
    return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "unknown")


def energy_by_bucket(spans: Sequence[tuple], buckets: Sequence[tuple[float, float, str]]) -> tuple[dict, dict]:
    kwh: dict[str, float] = {}
    unk: dict[str, float] = {}

    def add(s: tuple, ov: float, length: float, name: str) -> None:
        if s[2] is None:
            unk[name] = unk.get(name, 0.0) + ov / 3600.0
            kwh.setdefault(name, 0.0)
        else:
            kwh[name] = kwh.get(name, 0.0) + s[2] * ov / length / J_PER_KWH

    for s in spans:
        length = s[1] - s[0]
        if length <= 0:
            continue
        assigned = 0.0
        for b0, b1, name in buckets:
            ov = min(s[1], b1) - max(s[0], b0)
            if ov <= 0:
                continue
            assigned += ov
            add(s, ov, length, name)
        if length - assigned > 1e-9:
            add(s, length - assigned, length, "unassigned")
    return kwh, unk


def energy_cost(basis: Mapping[str, Any], measured_kwh: Decimal | None, tdp_w: float | None,
                gpu_hours: Decimal) -> dict:
    price = Decimal(str(basis.get("energy_price_per_kwh", 0))) * Decimal(str(basis.get("pue", 1)))
    tdp = Decimal(str(tdp_w or 0)) / Decimal(1000) * gpu_hours * price
    measured = None if measured_kwh is None else measured_kwh * price
    if basis.get("energy_basis") == "measured" and measured is not None:
        name, charged = "measured", measured
    elif basis.get("energy_basis") == "measured":
        name, charged = "tdp_fallback", tdp
    else:
        name, charged = "tdp", tdp
    return {"basis": name, "charged": charged, "measured": measured, "tdp": tdp}


def round6(x: float) -> float:
    """kWh and kg to 6 decimals (and -0.0 as 0.0), so the JSON is byte-stable on replay."""
    return round(x + 0.0, 6)


def money_text(d: Decimal | None) -> str | None:
    """Money to cents (half even) as text; None stays None."""
    return None if d is None else str(d.quantize(CENT, rounding=ROUND_HALF_EVEN))


def energy_parts(dev: Mapping[str, Any], w0: float, w1: float) -> tuple[tuple[float, float, Fraction], ...]:
    """Stage "price" of a shared device's energy: the parts of the window [w0, w1] and the share of the GPU's
    energy this run bears in each — its pods' share (``dev["shared"]``, or from each instant on under changing
    sharers, ``dev["segments"]``) times a MIG slice's share of its GPU (``mig_share``; a profile the MIG table does
    not know bears the whole, as its rate does). Empty for a whole GPU held alone: its energy is all the run's."""
    mig = slice_share(dev)
    if dev.get("segments"):
        segs, parts = dev["segments"], []
        for i, (t0, sh) in enumerate(segs):
            a = w0 if i == 0 else max(w0, min(w1, t0))
            b = w1 if i + 1 == len(segs) else max(w0, min(w1, segs[i + 1][0]))
            if b > a:
                parts.append((a, b, (sh[1] if sh else Fraction(1)) * (mig or 1)))
        return tuple(parts)
    share = dev["shared"][1] if dev.get("shared") is not None else None
    if share is None and mig is None:
        return ()
    return ((w0, w1, (share or Fraction(1)) * (mig or 1)),)


def slice_share(dev: Mapping[str, Any]) -> Fraction | None:
    """A MIG slice's share of its GPU (``mig_share``), None for a whole GPU or a profile the table does not know."""
    return mig_share(dev.get("mig_profile"), dev.get("sku")) if dev.get("mig_profile") else None


def slice_hours(dev: Mapping[str, Any], gpu_hours: Decimal) -> Decimal:
    """The GPU-hours a slice's TDP pricing bears: its hours times its share of the GPU (a whole GPU: all)."""
    mig = slice_share(dev)
    return gpu_hours if mig is None else gpu_hours * mig.numerator / mig.denominator


def part_buckets(a: float, b: float, suspended: Sequence[tuple[float, float]]) -> tuple:
    """A part [a, b] of the window as energy buckets: paid, and suspended where the run was suspended in it."""
    sus = sorted((max(a, x), min(b, y)) for x, y in suspended if min(b, y) > max(a, x))
    return tuple((x, y, "paid") for x, y in subtract((a, b), sus)) + tuple((x, y, "suspended") for x, y in sus)


def scaled(x: float, share: Fraction) -> float:
    """A float figure times a share, in the order both implementations use (exact for a share of 1)."""
    return x * share.numerator / share.denominator


def energy_block(devices: Sequence[tuple], currency: str) -> dict:
    """``devices``: (spans, buckets, tdp_w, gpu_hours, basis[, parts]) per device priced under an energy_basis;
    ``parts`` (receipt 1.5: a shared device) are (spans, buckets, share) whose shares of energy the run bears,
    and ``gpu_hours`` is then already the run's share of the GPU's hours."""
    def lines() -> Iterable[tuple]:
        for spans, dev_buckets, tdp_w, gpu_hours, basis, *more in devices:
            parts = more[0] if more and more[0] else ((spans, dev_buckets, None),)
            dev_kwh, dev_unk, bk, sources, any_spans = 0.0, 0.0, {}, set(), False
            for p_spans, p_buckets, share in parts:
                p_kwh = in_order_sum(s[2] for s in p_spans if s[2] is not None) / J_PER_KWH
                p_bk, p_unk = energy_by_bucket(p_spans, p_buckets)
                if share is not None:
                    p_kwh = scaled(p_kwh, share)
                    p_bk = {k: scaled(v, share) for k, v in p_bk.items()}
                    p_unk = {k: scaled(v, share) for k, v in p_unk.items()}
                dev_kwh += p_kwh
                dev_unk += in_order_sum(p_unk.values())
                for k, v in p_bk.items():
                    bk[k] = bk.get(k, 0.0) + v
                sources.add(_spans_source(p_spans))
                any_spans = any_spans or bool(p_spans)
            source = sources.pop() if len(sources) == 1 else "mixed"
            known = Decimal(repr(round6(dev_kwh))) if any_spans and source != "unknown" else None
            yield dev_kwh, source, bk, dev_unk, energy_cost(basis, known, tdp_w, gpu_hours)

    return energy_totals(lines(), currency)


def energy_totals(devices: Iterable[tuple[float, str, Mapping[str, float], float, Mapping[str, Any]]],
                  currency: str) -> dict:
    """Stage "bill" of energy: the receipt's ``energy`` block from each device's (kWh, source, kWh by bucket,
    unknown GPU-hours, cost line), added in device order; kWh rounded to 6 places, money to cents as text."""
    kwh = unknown_h = 0.0
    buckets: dict[str, float] = {}
    sources, bases = set(), set()
    charged = measured = tdp = Decimal(0)
    any_unmeasured = False
    for dev_kwh, source, bucket_kwh, dev_unknown_h, line in devices:
        kwh += dev_kwh
        sources.add(source)
        for k, v in bucket_kwh.items():
            buckets[k] = buckets.get(k, 0.0) + v
        unknown_h += dev_unknown_h
        bases.add(line["basis"])
        charged += line["charged"]
        tdp += line["tdp"]
        if line["measured"] is None:
            any_unmeasured = True
        else:
            measured += line["measured"]
    source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "unknown")
    return {"kwh": round6(kwh), "source": source,
            "by_bucket": {k: round6(v) for k, v in sorted(buckets.items())},
            "unknown_gpu_hours": round6(unknown_h),
            "cost": {"currency": currency, "basis": bases.pop() if len(bases) == 1 else "mixed",
                     "charged": money_text(charged), "measured": None if any_unmeasured else money_text(measured),
                     "tdp": money_text(tdp)}}


def _column_pairs(rows: Sequence[Sequence], column: str) -> list[tuple[float, float]]:
    i, ti = SAMPLE_COLUMNS.index(column), SAMPLE_COLUMNS.index("t")
    out = []
    for r in sorted(rows, key=lambda r: float(r[ti])):
        v = r[i]
        if v is not None and not math.isnan(float(v)) and not math.isnan(float(r[ti])):
            out.append((float(r[ti]), float(v)))
    return out


# --- the run's end and progress (docs/receipts.md, "Progress") ----------------------------------------------

SAVED_MARKS = ("checkpoint", "output")   # marks after which the work done so far survives a failure
PROVIDER_FAILURE_STATES = ("NODE_FAIL", "BOOT_FAIL")

# Who controls the evidence (docs/method.md, "Who controls the evidence"; the ledger's tables are
# ledger/method/evidence.py and ledger/method/xids.toml, and a test holds these equal to them).
PARTIES = ("provider", "scheduler", "vendor_tool", "job_user")
CAUSE_CONTROLLED_BY = {
    "drop_place_over_quota": "job_user", "drop_place_unclean": "job_user", "marks_refused": "job_user",
    "epilog_missing": "scheduler", "prolog_missing": "scheduler",
    **{c: "vendor_tool" for c in (
        "dcgm_host_engine_restart", "dcgm_watch_not_started", "dcgm_no_data", "dcgm_timeout", "dcgm_unreachable",
        "dcgm_unparsed", "dcgm_error", "dcgm_device_missing", "dcgm_watch_late", "dcgm_stopped_early",
        "amdsmi_timeout", "amdsmi_error", "amdsmi_no_baseline", "amdsmi_no_data", "device_uuid_unknown")},
    **{c: "provider" for c in ("collector_down", "source_error", "counter_reset", "evidence_refused")},
}
END_STATE_CONTROLLED_BY = {"NODE_FAIL": "scheduler", "BOOT_FAIL": "scheduler", "PREEMPTED": "scheduler"}
XID_CLASS = {8: "application", 13: "application", 31: "application", 32: "driver", 43: "application",
             45: "application", 48: "hardware", 62: "hardware", 63: "hardware", 64: "hardware", 74: "hardware",
             79: "hardware", 92: "hardware", 94: "hardware", 95: "hardware", 119: "driver", 120: "driver"}
PROVIDER_XID_CLASSES = frozenset({"hardware", "driver"})
PROVIDER_XIDS = frozenset(x for x, c in XID_CLASS.items() if c in PROVIDER_XID_CLASSES)
REPLACED_BY_SAMPLES = "node_collector_samples"


def controlled_by(cause: Any) -> str:
    return CAUSE_CONTROLLED_BY.get(str(cause), "provider")


def rests_on_dcgm_job_record(cause: Any, source: Any) -> bool:
    """A DCGM cause a hook recorded, or derived at ship time from a hook's tool output."""
    src = str(source or "")
    return (str(cause).startswith("dcgm_") and cause in CAUSE_CONTROLLED_BY
            and (src == "ipledger.derive" or src.startswith("hook")))


def xids_raised(samples: Iterable[tuple]) -> list[tuple[float, int]]:
    """[(t, code)] of the XIDs a device's (t, xid) samples show raised: a code counts where an earlier sample
    held a different value; t is the first sample showing it after one."""
    seen = sorted((float(t), int(x)) for t, x in samples if x is not None and x == x and t == t)
    out = []
    for code in sorted({x for _t, x in seen if x > 0}):
        other = [t for t, x in seen if x != code]
        later = [t for t, x in seen if x == code and other and t > other[0]]
        if later:
            out.append((later[0], code))
    return sorted(out)
MAX_LISTED_OUTPUTS = 20
ACCOUNTING_FIELDS = ("qos", "tres", "time_limit_s", "suspended_s", "final_state")
STATE_RANK = {"sacct": 0, "hook.slurmctld": 1}   # whose allocation_ended state wins; any other source ranks 2


def final_state(entries: Sequence[Entry]) -> tuple[str | None, str | None]:
    """(final state, its source): the accounting database's, else the controller's, else a node's; among
    equals the latest in chain order."""
    best = None
    for e in entries:
        if e.kind == "allocation_ended":
            r = STATE_RANK.get(e.source, 2)
            if best is None or r <= best[0]:
                best = (r, e.data.get("state"), e.source)
    return (best[1], best[2]) if best else (None, None)


def run_accounting(entries: Sequence[Entry]) -> dict | None:
    """The receipt's ``job.accounting``: only for runs the Slurm hooks recorded."""
    if not any(e.source in ("hook.slurm", "hook.slurmctld") for e in entries):
        return None
    state, source = final_state(entries)
    return {"source": "sacct", "state": state} if source == "sacct" else {"pending": list(ACCOUNTING_FIELDS)}


def end_state(entries: Sequence[Entry]) -> str | None:
    """The run's own last ``allocation_ended`` state (``ledger.receipts.progress.end_state``)."""
    state, _source = final_state(entries)
    if state:
        return str(state)
    requeued = any(e.kind == "allocation_requeued" and e.data.get("next_run") is not None for e in entries)
    return "REQUEUED" if requeued else None


def provider_failure(state: str | None, xids: Sequence[tuple],
                     classes: Mapping[int, str] = XID_CLASS) -> str | None:
    """The provider's failure that ended a run (the state, or ``xid``), or None: the scheduler's NODE_FAIL or
    BOOT_FAIL, or an XID of a hardware or driver class (``classes``: XID -> class) raised on one of the run's
    devices, (device, t, code), in a run that did not complete."""
    if state in PROVIDER_FAILURE_STATES:
        return state
    if state not in (None, "COMPLETED") and any(classes.get(code) in PROVIDER_XID_CLASSES for _d, _t, code in xids):
        return "xid"
    return None


def failure_evidence(state: str | None, xids: Sequence[tuple], dcgm_count: int | None,
                     classes: Mapping[int, str] = XID_CLASS) -> list[dict]:
    """What the provider-failure answer rests on, each piece with the party that controls it."""
    out: list[dict] = [{"what": "end_state", "value": state,
                        "controlled_by": END_STATE_CONTROLLED_BY.get(str(state), "job_user"),
                        "provider_side": state in PROVIDER_FAILURE_STATES}]
    for device, _t, code in sorted(xids, key=lambda x: (x[1], x[0], x[2])):
        cls = classes.get(code, "unclassified")
        out.append({"what": "xid", "value": code, "device": device, "class": cls,
                    "controlled_by": "vendor_tool", "provider_side": cls in PROVIDER_XID_CLASSES})
    if dcgm_count:
        # DCGM's job statistics count XIDs of any class (a device assert in the user's kernel counts too) and
        # name none of them: not provider-side evidence on its own.
        out.append({"what": "dcgm_critical_xid_errors", "value": dcgm_count, "controlled_by": "vendor_tool",
                    "provider_side": False})
    return out


def dcgm_xid_count(entries: Sequence[Entry]) -> int:
    total = 0
    for e in entries:
        values = e.data.get("values") if e.kind == "telemetry_summary" else None
        v = values.get("xid_errors") if isinstance(values, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v > 0:
            total += int(v)
    return total


def cut(span: tuple[float, float], cuts: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """``span`` less each cut in turn (sorted), piece by piece: the ledger's pieces, so its float sums."""
    parts = [span]
    for a, b in sorted(cuts):
        nxt = []
        for x, y in parts:
            if b <= x or a >= y:
                nxt.append((x, y))
                continue
            if a > x:
                nxt.append((x, a))
            if b < y:
                nxt.append((b, y))
        parts = nxt
    return parts


def seconds_of(parts: Sequence[tuple[float, float]]) -> float:
    return in_order_sum(b - a for a, b in parts)


def progress_block(entries: Sequence[Entry], window: tuple[float, float], n_devices: int,
                   suspended: Sequence[tuple[float, float]],
                   credit: bool, xids: Sequence[tuple] = (), classes: Mapping[int, str] = XID_CLASS
                   ) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """The receipt's ``progress`` block, and the span [from, end) credited as lost work (else None).

    ``entries``: the run's own (anything with ``kind``, ``ts``, ``data``, ``source``); ``xids``: (device, t, code)
    raised on its devices in its window; ``classes``: XID -> class (the verifier's table unless given)."""
    w0, w1 = window
    marks = sorted(({"ts": e.ts, "t": to_epoch(e.ts), "kind": e.data.get("kind") or "checkpoint",
                     "step": e.data.get("step"), "note": e.data.get("note")}
                    for e in entries if e.kind == "progress"), key=lambda m: (m["t"], m["kind"]))
    marks = [m for m in marks if w0 <= m["t"] <= w1]
    checkpoints = [m for m in marks if m["kind"] == "checkpoint"]
    steps = [m["step"] for m in marks if m["step"] is not None]
    state = end_state(entries)
    block: dict[str, Any] = {
        "marks": {"count": len(marks), **{k: sum(m["kind"] == k for m in marks)
                                          for k in ("checkpoint", "output", "step")}},
        "first_checkpoint": checkpoints[0]["ts"] if checkpoints else None,
        "last_checkpoint": checkpoints[-1]["ts"] if checkpoints else None,
        "last_step": max(steps) if steps else None,
        "accepted_outputs": [{"ts": m["ts"], "step": m["step"], "note": m["note"]}
                             for m in marks if m["kind"] == "output"][-MAX_LISTED_OUTPUTS:],
        "end_state": state,
        "lost_since_checkpoint": None,
        "marks_controlled_by": "job_user",
    }
    if state is None or state == "COMPLETED":
        return block, None
    saved = [m for m in marks if m["kind"] in SAVED_MARKS]
    frm = max(m["t"] for m in saved) if saved else w0
    lost_nanohours = n_devices * to_nanohours(seconds_of(cut((frm, w1), suspended)))
    cause = provider_failure(state, xids, classes)
    credited = cause is not None and credit
    block["lost_since_checkpoint"] = {
        "gpu_hours": hours(lost_nanohours), "from": saved[-1]["ts"] if saved else format_ts(w0),
        "from_basis": saved[-1]["kind"] if saved else "start", "to": format_ts(w1),
        "provider_failure": cause, "billed_as": "credit" if credited else "charge",
        "evidence": failure_evidence(state, xids, dcgm_xid_count(entries), classes)}
    return block, ((frm, w1) if credited else None)


# --- the receipt -------------------------------------------------------------------------------------------

def hours_block(b: Sequence[int], paid_nanohours: int, suspended_nanohours: int) -> dict:
    """A ``gpu_hours`` block (the receipt's and each device line's) from integer nanohours per bucket."""
    d = dict(zip(BUCKETS, b))
    return {"paid": hours(paid_nanohours), "delivered": hours(d["delivered"]), "underutilized": hours(d["underutilized"]),
            "starved": hours(d["starved"]), "idle_held": hours(d["idle_held"]), "unknown": hours(d["unknown"]),
            "suspended": hours(suspended_nanohours),
            "throttled": {r: hours(d[f"throttled.{r}"]) for r in THROTTLE_REASONS}}


@dataclass
class Frame:
    start: str | None
    end: str | None
    open: bool
    ctx: dict
    devices: list[dict]
    nodes: list[str]
    suspended: list[tuple[float, float]]


def run_frame(entries: Sequence[Entry], open_end: str | None = None) -> Frame:
    started = [c for c in entries if c.kind == "allocation_started"]
    ended = [c for c in entries if c.kind == "allocation_ended"]
    start = min((c.ts for c in started), key=to_epoch, default=None)
    end = max((c.ts for c in ended), key=to_epoch, default=None)
    is_open = end is None
    if end is None:
        ends = [to_epoch(c.ts_end or c.ts) for c in entries
                if c.kind not in ("adjustment", "gap_resolution", "evidence_refused")]
        if open_end is not None:
            ends.append(to_epoch(open_end))
        if start is not None and ends:
            end = format_ts(max(max(ends), to_epoch(start)))
    ctx: dict = {}
    for c in started:
        for k, v in c.data.items():
            ctx.setdefault(k, v)
    devices: dict[str, dict] = {}
    bounds: dict[str, list] = {}
    for c in entries:
        if c.kind != "device_bound":
            continue
        d = c.data
        uuid = c.device or d.get("uuid")
        if uuid is None:
            continue
        bounds.setdefault(uuid, []).append((to_epoch(c.ts), d))
        if uuid in devices:
            continue
        devices[uuid] = {"uuid": uuid, "node": c.node or d.get("node"), "index": d.get("index"), "sku": d.get("sku"),
                         "mig_profile": d.get("mig_profile"), "mig_instance": d.get("mig_instance"),
                         "gpu_uuid": d.get("gpu_uuid"), "shared": share_of(d)}
    for uuid, dev in devices.items():   # the pods holding it changed: each later device_bound restates the share
        segs: list = []
        for ts, d in sorted(bounds[uuid], key=lambda x: x[0]):
            sh = share_of(d)
            if not segs or segs[-1][1] != sh:
                segs.append((ts, sh))
        if len(segs) > 1:
            dev["segments"] = segs
            dev["shared"] = ("segments", None)
    nodes = sorted({d["node"] for d in devices.values() if d["node"]} | {c.node for c in started if c.node})
    resumed = sorted(to_epoch(c.ts) for c in entries if c.kind == "allocation_resumed")
    susp = []
    for c in entries:
        if c.kind == "allocation_suspended":
            a = to_epoch(c.ts)
            b = to_epoch(c.ts_end) if c.ts_end else next((r for r in resumed if r >= a), to_epoch(end) if end else a)
            susp.append((a, b))
    devs = sorted(devices.values(), key=lambda d: (str(d["node"]), d["index"] if isinstance(d["index"], int)
                                                     else 1 << 30, d["uuid"]))
    return Frame(start, end, is_open, ctx, devs, nodes, sorted(susp))


def gap_applies(gap: Entry, device: Mapping, job_id: str, run: int) -> bool:
    if gap.job_id is not None and (gap.job_id != job_id or (gap.run or 0) != run):
        return False
    if gap.device is not None:
        return gap.device == device["uuid"]
    if gap.node is not None:
        return gap.node == device["node"]
    return gap.job_id is not None


def _prefix_overlap(e: Entry, start: str, end: str) -> bool:
    """The ledger's coarse window test (seconds prefix of the text), refined by callers in epoch seconds."""
    return e.ts[:19] <= end[:19] and (e.ts_end or e.ts)[:19] >= start[:19]


def _seg_devices(e: Entry) -> list:
    return e.data.get("devices") or ([e.device] if e.device else [])


def compute_receipt(entries: Sequence[Entry], samples: Mapping[str, Sequence[Sequence]], job: Mapping[str, Any],
                    site_skus: Mapping[str, tuple], energy_shares: bool = True) -> dict:
    """The receipt body of run (cluster, job_id, run) from the ledger's entries (any superset of those it
    depends on, all at or before the head) and the rows of its telemetry segments. ``energy_shares`` False: a
    shared device's energy as receipt 1.4 billed it (the whole GPU's), to check a receipt issued as 1.4."""
    cluster, job_id, run = job["cluster"], job["job_id"], job["run"]
    table = {**SKUS, **site_skus}
    ordered = sorted(entries, key=lambda c: c.seq)
    mine = [c for c in ordered if c.job_id == job_id and c.cluster == cluster and (c.run or 0) == run
            and c.kind not in ("receipt_issued", "evidence_refused")]
    # Stage frame: the run's window, devices and context.
    frame = run_frame(mine)
    if frame.start is None:
        raise Failure(f"job {job_id} run {run}: no allocation_started entry among the bundled entries")
    segs_all = [c for c in ordered if c.kind == "telemetry_segment"]
    open_end = None
    if frame.open:
        uuids0 = {d["uuid"] for d in frame.devices}
        later = [s for s in segs_all if _prefix_overlap(s, frame.start, "9999-12-31T23:59:59Z")
                 and set(s.data.get("devices") or [s.device]) & uuids0]
        if later:
            open_end = max((s.ts_end or s.ts for s in later), key=to_epoch)
            frame = run_frame(mine, open_end)
    start, end = frame.start, frame.end or frame.start
    w0, w1 = to_epoch(start), to_epoch(end)
    uuids, nodes = {d["uuid"] for d in frame.devices}, set(frame.nodes)

    def in_window(e: Entry) -> bool:
        return _prefix_overlap(e, start, end) and to_epoch(e.ts_end or e.ts) > w0 and to_epoch(e.ts) < w1

    gaps = [g for g in ordered if g.kind == "unknown_interval" and g.job_id is None and in_window(g)
            and (g.device in uuids or (g.device is None and g.node in nodes))]
    resolutions_in = [c for c in ordered if c.kind == "gap_resolution" and c.job_id is None]
    contracts = [c for c in ordered if c.kind == "contract_version"]
    segments = [s for s in segs_all if in_window(s) and set(_seg_devices(s)) & uuids]

    # The contract: the latest contract_version that applies to the run's account.
    account = frame.ctx.get("account")
    chosen = None
    for c in contracts:
        accounts = c.data.get("accounts") or []
        if accounts and account not in accounts:
            continue
        if chosen is None or c.seq > chosen.seq:
            chosen = c
    contract = DEFAULT_CONTRACT if chosen is None else chosen.data

    all_gaps = sorted({c.seq: c for c in (*gaps, *(c for c in mine if c.kind == "unknown_interval"))}.values(),
                      key=lambda c: c.seq)
    gap_ids = {g.entry_id for g in all_gaps}
    resolutions: dict[str, Entry] = {}
    for r in sorted((*resolutions_in, *(c for c in mine if c.kind == "gap_resolution")), key=lambda c: c.seq):
        gid = r.data.get("gap_id")
        if gid in gap_ids:
            resolutions[gid] = r
    summaries = {c.device: c for c in mine if c.kind == "telemetry_summary" and c.device}

    # Each device's samples: every row of its segments inside the window, in (t, then every column) order.
    rows_of: dict[str, list] = {}
    seg_ids = {s.entry_id for s in segments}
    for sid in sorted(seg_ids):
        for r in samples.get(sid, ()):
            if r[0] in uuids and r[2] is not None and r[1] + r[2] > w0 and r[1] < w1:
                rows_of.setdefault(r[0], []).append(r)
    cols = [SAMPLE_COLUMNS.index(c) for c in ("t", "dt", "clock_reasons", "sm_active", "tensor_active",
                                               "gpu_util", "sm_clock_mhz", "compute_procs", "fb_used_mib")]

    def order(r: Sequence) -> tuple:
        return tuple((1, 0.0) if r[i] is None else (0, float(r[i])) for i in cols)

    # Stage attribute: each device's integer nanohours per bucket, one sample at a time. Independent evidence
    # wins: a device the collector's segments cover is measured by its samples where an interval rests only on
    # DCGM's job record.
    sampled = {d for s in segments for d in _seg_devices(s) if d}
    replaced, kept = set(), set()
    accounts, gaps_of = [], {}
    device_paid: dict[str, int] = {}
    for dev in frame.devices:
        key = match_sku(dev.get("sku"), table)
        rated = table[key][0] if key else None
        spans = []
        for g in all_gaps:
            if not gap_applies(g, dev, job_id, run):
                continue
            if dev["uuid"] in sampled and rests_on_dcgm_job_record(g.data.get("cause"), g.source):
                replaced.add(g.entry_id)
                continue
            kept.add(g.entry_id)
            spans.append((to_epoch(g.ts), to_epoch(g.ts_end or g.ts), g.entry_id))
        rows = sorted(rows_of.get(dev["uuid"], []), key=order)

        def attribute_window(window: tuple[float, float], rows=rows, spans=spans, uuid=dev["uuid"],
                             rated=rated) -> Account:
            if rows:
                return attribute_samples(window, rows, spans, frame.suspended, rated)
            if uuid in summaries:
                return attribute_summary(window, summaries[uuid].data, spans, frame.suspended, rated)
            return attribute_samples(window, [], spans, frame.suspended, rated)

        acc = attribute_window((w0, w1))
        if dev.get("segments"):   # the sharers changed: each part of the window pays that part's share
            device_paid[dev["uuid"]] = acc.paid_nanohours
            parts = []
            sg = dev["segments"]
            for i, (t0, sh) in enumerate(sg):
                a = w0 if i == 0 else max(w0, min(w1, t0))
                b = w1 if i + 1 == len(sg) else max(w0, min(w1, sg[i + 1][0]))
                if b <= a:
                    continue
                part = attribute_window((a, b))
                parts.append(part if sh is None else scale_account(part, sh[1]))
            if parts:
                acc = sum_accounts(parts, acc.fidelity)
        elif dev["shared"] is not None:   # several runs hold the device: this run pays its share
            device_paid[dev["uuid"]] = acc.paid_nanohours
            acc = scale_account(acc, dev["shared"][1])
        accounts.append((dev, key, acc))
        gaps_of[dev["uuid"]] = spans

    run_total = sum_accounts([acc for _d, _k, acc in accounts], "run")
    total, paid_nanohours, suspended_nanohours, coarse_nanohours = run_total.buckets, run_total.paid_nanohours, run_total.suspended_nanohours, \
        run_total.coarse_nanohours
    gap_nanohours, causes = run_total.gap_nanohours, run_total.causes

    replaced -= kept
    xid_col = SAMPLE_COLUMNS.index("xid")
    xids = [(dev["uuid"], t, code) for dev in frame.devices
            for t, code in xids_raised((r[1], r[xid_col]) for r in rows_of.get(dev["uuid"], []))]
    progress, credited_span = progress_block(mine, (w0, w1), len(frame.devices), frame.suspended,
                                             contract.get("provider_failure_loss", "charge") == "credit", xids)

    intervals, gap_policy = [], {}
    for g in all_gaps:
        gid = g.entry_id
        if gid not in gap_nanohours and g.job_id is None:
            continue
        d = g.data
        res = resolutions.get(gid)
        cause = d.get("cause", "unspecified")
        policy = (res.data.get("resolution") if res else contract.get("user_caused_unknown", "charge")
                  if controlled_by(cause) == "job_user" else contract["unknown_policy"])
        gap_policy[gid] = policy
        causes[cause] = causes.get(cause, 0) + gap_nanohours.get(gid, 0)
        intervals.append({
            "id": gid, "device": g.device, "node": g.node, "scope": d.get("scope"), "start": g.ts, "end": g.ts_end,
            "cause": cause, "detail": d.get("detail"), "gpu_hours": hours(gap_nanohours.get(gid, 0)), "policy": policy,
            "controlled_by": controlled_by(cause), "replaced_by": REPLACED_BY_SAMPLES if gid in replaced else None,
            "resolution": None if res is None else {
                "as": res.data.get("resolution"), "reason": res.data.get("reason"), "by": res.data.get("by"),
                "entry_id": res.entry_id, "ts": res.ts},
        })

    # Stages price and bill, per device.
    by_policy = {p: 0 for p in POLICIES}
    rates: dict[str, Decimal] = {}
    cost = {k: Decimal(0) for k in ("paid", "billed", "suspended", *BUCKETS)}
    billed_total = lost_credited = 0
    default_policy = contract["unknown_policy"]
    dev_lines = []
    for dev, key, acc in accounts:
        rate, rate_key, mig = device_rate(contract, key, table[key][1] if key else None, dev)
        rates[rate_key] = rate
        unknown_by, lost, billed = bill_device(acc, gaps_of[dev["uuid"]], gap_policy, default_policy,
                                               contract["charge_suspended"], credited_span, frame.suspended,
                                               contract["billing_granularity_s"], contract["billing_minimum_s"])
        for p, v in unknown_by.items():
            by_policy[p] += v
        lost_credited += lost
        billed_total += billed
        price_device(cost, acc, billed, rate)
        dev_lines.append(device_line(dev, key, acc, billed, rate, mig, w0, device_paid.get(dev["uuid"])))
    fidelities = sorted({acc.fidelity for _d, _k, acc in accounts})
    fidelity = fidelities[0] if len(fidelities) == 1 else ("mixed" if fidelities else "none")
    paid_cost, delivered_cost, billed_cost = money(cost["paid"]), money(cost["delivered"]), money(cost["billed"])
    # receipt 1.4: energy under an energy_basis is its own line, billed on top of the GPU-hours
    energy_rows, any_share = [], False
    for dev, key, acc in accounts:
        basis = basis_for(contract, key)
        if basis.get("energy_basis") is None:
            continue
        rows = rows_of.get(dev["uuid"], [])
        energy_j, power_w = _column_pairs(rows, "energy_j"), _column_pairs(rows, "power_w")
        spans = device_energy(energy_j, w0, w1, power_w)
        dev_buckets = tuple((a, b, "paid") for a, b in subtract((w0, w1), sorted(frame.suspended))) + tuple(
            (a, b, "suspended") for a, b in frame.suspended)
        gpu_hours = Decimal(acc.paid_nanohours) / NANOHOURS
        parts = energy_parts(dev, w0, w1) if energy_shares else ()
        if parts:   # receipt 1.5: the run bears its share of the GPU's energy (and of its TDP hours on a slice)
            any_share = True
            parts = tuple((device_energy(energy_j, a, b, power_w), part_buckets(a, b, frame.suspended), sh)
                          for a, b, sh in parts)
            gpu_hours = slice_hours(dev, gpu_hours)
        energy_rows.append((spans, dev_buckets, table[key][1] if key else None, gpu_hours, basis, parts))
    energy = energy_block(energy_rows, contract["currency"]) if energy_rows else None
    if energy is not None:
        billed_cost += Decimal(energy["cost"]["charged"])
    mean_rate = (sum(rates.values(), Decimal(0)) / len(rates)) if rates else Decimal(0)

    adjustments, adj_total, adj_nanohours = adjustments_block((c for c in mine if c.kind == "adjustment"), mean_rate)

    relevant = [*mine, *(g for g in gaps if g.entry_id in gap_policy), *resolutions.values(), *segments,
                *([chosen] if chosen is not None else [])]
    last = max(relevant, key=lambda c: c.seq)
    est = estimated_delivered(by_policy["estimate"], total[0], paid_nanohours, total[-1])

    body: dict[str, Any] = {
        "receipt_version": RECEIPT_VERSION,
        "job": {"cluster": cluster, "job_id": job_id, "run": run, "account": account,
                "partition": frame.ctx.get("partition"), "qos": frame.ctx.get("qos"),
                "devices": [{k: d[k] for k in ("uuid", "node", "index", "sku")} for d in frame.devices]},
        "window": {"start": frame.start, "end": frame.end},
        "open": frame.open,
        "contract": {"id": str(contract["id"]), "version": str(contract["version"]),
                     "entry_id": None if chosen is None else chosen.entry_id,
                     "currency": contract["currency"], "unknown_policy": contract["unknown_policy"],
                     "charge_suspended": contract["charge_suspended"],
                     "billing_granularity_s": contract["billing_granularity_s"],
                     "billing_minimum_s": contract["billing_minimum_s"],
                     "provider_failure_loss": contract.get("provider_failure_loss", "charge"),
                     **({} if contract.get("period_rule", "split") == "split"
                        else {"period_rule": contract["period_rule"]}),
                     **({} if contract.get("user_caused_unknown", "charge") == "charge"
                        else {"user_caused_unknown": contract["user_caused_unknown"]})},
        "method": {"name": METHOD_NAME, "version": METHOD_VERSION, "fidelity": fidelity,
                   "coarse_signal_gpu_hours": hours(coarse_nanohours),
                   "thresholds": {"active_min": ACTIVE_MIN, "resident_fb_mib": RESIDENT_FB_MIB}},
        "gpu_hours": hours_block(total, paid_nanohours, suspended_nanohours),
        "unknown_by_cause": {k: hours(v) for k, v in sorted(causes.items()) if v},
        "unknown_intervals": intervals,
        "progress": progress,
        "billing": {"gpu_hours_paid": hours(paid_nanohours),
                    "unknown_gpu_hours_by_policy": {p: hours(v) for p, v in by_policy.items()},
                    "estimated_delivered_in_unknown": hours(est),
                    "suspended_charged": contract["charge_suspended"],
                    "lost_since_checkpoint_credited": hours(lost_credited),
                    "gpu_hours_billed": hours(billed_total)},
        "devices": dev_lines,
        "adjustments": adjustments,
        "cost": {"currency": contract["currency"],
                 "rates_per_gpu_hour": {k: str(v) for k, v in sorted(rates.items())},
                 "paid": float(paid_cost), "delivered": float(delivered_cost),
                 "lost": float(paid_cost - delivered_cost),
                 "by_bucket": {name: float(money(cost[name])) for name in BUCKETS},
                 "billed_before_adjustments": float(billed_cost), "adjustments": float(adj_total),
                 "billed_after_adjustments": float(billed_cost + adj_total)},
        "totals": {"before_adjustments": {"gpu_hours": hours(billed_total), "amount": float(billed_cost)},
                   "after_adjustments": {"gpu_hours": hours(billed_total + adj_nanohours),
                                         "amount": float(billed_cost + adj_total)}},
        "ledger": {"through_seq": last.seq, "head_hash": last.hash},
    }
    if energy is not None:   # only under measured-energy terms: every other receipt keeps version 1.2
        body["receipt_version"] = ENERGY_SHARE_RECEIPT_VERSION if any_share else ENERGY_RECEIPT_VERSION
        body["energy"] = energy
        body["cost"]["energy"] = energy["cost"]["charged"]
    accounting = run_accounting(mine)
    if accounting is not None:
        body["job"]["accounting"] = accounting
    body["receipt_hash"] = receipt_hash(body)
    return body


def receipt_hash(body: Mapping[str, Any]) -> str:
    return "sha256:" + sha256_hex(canonical_json({k: v for k, v in body.items() if k != "receipt_hash"}))


# --- checking a bundle ---------------------------------------------------------------------------------------

BUNDLE_KEYS = {"format", "head", "method", "receipt", "entries", "samples"}


def samples_digest(rows: Sequence[Sequence]) -> str:
    """The digest a telemetry_segment entry seals: canonical JSON lines of its rows, sorted by (device, t)."""
    h = hashlib.sha256()
    for r in rows:
        h.update(canonical_json(list(r)).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """The first key path at which two JSON values differ (for naming what failed)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b or canonical_json(a[k]) != canonical_json(b[k]):
                return first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if canonical_json(x) != canonical_json(y):
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path or '(top)'}: bundled {json.dumps(b)[:120]}, recomputed {json.dumps(a)[:120]}"


def _site_skus(raw: Any) -> dict[str, tuple]:
    if not isinstance(raw, dict):
        raise Failure("method.site_skus: expected an object")
    out = {}
    for key, row in raw.items():
        if not isinstance(row, dict) or set(row) != {"rated_sm_clock_mhz", "tdp_w", "match"}:
            raise Failure(f"method.site_skus.{key}: expected rated_sm_clock_mhz, tdp_w and match")
        out[key] = (row["rated_sm_clock_mhz"], row["tdp_w"], tuple(row["match"]))
    return out


def _malformed_as_failure(check: Callable[[bytes, Any], dict]) -> Callable[[bytes, Any], dict]:
    """A value of an unexpected type deep in a document is a failed check too, named, never a traceback."""
    def wrapped(raw: bytes, public_key: Any) -> dict:
        try:
            return check(raw, public_key)
        except (TypeError, KeyError, ValueError, AttributeError, IndexError, ArithmeticError, RecursionError) as exc:
            raise Failure(f"malformed content ({type(exc).__name__}: {exc})") from None
    wrapped.__doc__ = check.__doc__
    return wrapped


@_malformed_as_failure
def verify_bundle(raw: bytes, public_key: Any) -> dict:
    """Every check of a proof bundle; returns a summary (receipt hash, head, counts) or raises Failure."""
    try:
        bundle = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Failure(f"bundle: not JSON ({exc})") from None
    if not isinstance(bundle, dict) or set(bundle) != BUNDLE_KEYS or bundle["format"] != BUNDLE_FORMAT:
        raise Failure(f"bundle: not an {BUNDLE_FORMAT} bundle")
    if (canonical_json(bundle) + "\n").encode("utf-8") != raw:
        raise Failure("bundle: not in canonical form (its bytes were changed after it was written)")
    size, root = check_head(bundle["head"], public_key, "head")
    method = bundle["method"]
    if not isinstance(method, dict) or set(method) != {"name", "version", "receipt_version", "site_skus"} or (
            method["name"], method["version"]) != (METHOD_NAME, METHOD_VERSION) or \
            method["receipt_version"] not in RECEIPT_VERSIONS:
        raise Failure(f"method: this verifier implements {METHOD_NAME} {METHOD_VERSION} (receipt "
                      f"{' and '.join(RECEIPT_VERSIONS)}) only")
    site_skus = _site_skus(method["site_skus"])
    entries: list[Entry] = []
    if not isinstance(bundle["entries"], list) or not bundle["entries"]:
        raise Failure("entries: expected a non-empty list")
    for i, item in enumerate(bundle["entries"]):
        where = f"entries[{i}]"
        if not isinstance(item, dict) or set(item) != {"leaf", "proof"} or not isinstance(item["leaf"], str) \
                or not isinstance(item["proof"], list):
            raise Failure(f"{where}: expected leaf and proof")
        e = parse_leaf(item["leaf"], where)
        path = [_hex32(p, f"{where}.proof[{j}]") for j, p in enumerate(item["proof"])]
        if e.seq > size:
            raise Failure(f"{where}: entry {e.seq} is after the signed head (tree size {size})")
        if root_from_inclusion(e.seq - 1, size, leaf_hash(item["leaf"].encode("utf-8")), path) != root:
            raise Failure(f"{where}: entry {e.seq} ({e.entry_id}) is not included in the signed tree")
        if entries and e.seq <= entries[-1].seq:
            raise Failure(f"{where}: entries are not in sequence order")
        entries.append(e)
    by_id = {e.entry_id: e for e in entries}
    samples = bundle["samples"]
    if not isinstance(samples, dict):
        raise Failure("samples: expected an object of segment id -> rows")
    wide: dict[str, list] = {}   # every segment's rows in SAMPLE_COLUMNS, the method's stages read them so
    for sid, rows in samples.items():
        seg = by_id.get(sid)
        if seg is None or seg.kind != "telemetry_segment":
            raise Failure(f"samples.{sid}: no bundled telemetry_segment entry seals these rows")
        columns = segment_columns(seg.data.get("columns"), f"entry {seg.seq} columns")
        if not isinstance(rows, list) or any(not isinstance(r, list) or len(r) != len(columns) for r in rows):
            raise Failure(f"samples.{sid}: expected rows of {len(columns)} values")
        if any((rows[i][0], rows[i][1]) > (rows[i + 1][0], rows[i + 1][1]) for i in range(len(rows) - 1)):
            raise Failure(f"samples.{sid}: rows are not in (device, t) order")
        if samples_digest(rows) != seg.data.get("samples_sha256"):
            raise Failure(f"samples.{sid}: rows do not hash to the digest entry {seg.seq} sealed")
        wide[sid] = widen_rows(rows, columns)
    for e in entries:
        if e.kind == "telemetry_segment" and e.data.get("rows") and e.entry_id not in samples:
            raise Failure(f"samples: the rows of segment {e.entry_id} (entry {e.seq}) are missing")
    claimed = bundle["receipt"]
    if not isinstance(claimed, dict) or not isinstance(claimed.get("job"), dict):
        raise Failure("receipt: expected a receipt object")
    recomputed = compute_receipt(entries, wide, claimed["job"], site_skus,
                                 energy_shares=method["receipt_version"] != ENERGY_RECEIPT_VERSION)
    if canonical_json(recomputed) != canonical_json(claimed):
        raise Failure("receipt: the bundled receipt is not what its entries give: "
                      + first_difference(recomputed, claimed))
    return {"receipt_hash": recomputed["receipt_hash"], "tree_size": size, "root_hash": root.hex(),
            "log_id": bundle["head"]["log_id"], "timestamp": bundle["head"]["timestamp"],
            "entries": len(entries), "segments": len(samples), "site_skus": sorted(site_skus)}


@_malformed_as_failure
def verify_consistency(raw: bytes, public_key: Any) -> dict:
    """Both heads verify under the key and the proof shows the new tree extends the old one."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Failure(f"consistency file: not JSON ({exc})") from None
    if not isinstance(doc, dict) or set(doc) != {"format", "old_head", "new_head", "proof"} \
            or doc["format"] != CONSISTENCY_FORMAT or not isinstance(doc["proof"], list):
        raise Failure(f"consistency file: not an {CONSISTENCY_FORMAT} document")
    old_size, old_root = check_head(doc["old_head"], public_key, "old_head")
    new_size, new_root = check_head(doc["new_head"], public_key, "new_head")
    proof = [_hex32(p, f"proof[{i}]") for i, p in enumerate(doc["proof"])]
    check_consistency(old_size, new_size, old_root, new_root, proof)
    return {"old_tree_size": old_size, "new_tree_size": new_size, "old_root": old_root.hex(),
            "new_root": new_root.hex(), "log_id": doc["new_head"]["log_id"],
            "trivial": old_size == 0}  # from the empty tree: true of every log, so it shows nothing of this one


def _shown(text: object) -> str:
    """Text from a bundle or a file name, safe to print on a terminal: a control character, DEL, a bidi
    override or any other unprintable character becomes its ``\\x``/``\\u`` escape (a backslash is
    doubled), so a crafted bundle cannot rewrite what the tenant sees."""
    out = []
    for c in str(text):
        if c == "\\":
            out.append("\\\\")
        elif c.isprintable():
            out.append(c)
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: exit 0 and print the receipt hash (or the consistency summary), else exit 1 naming
    what failed."""
    import argparse   # here, not at the top: the receipts import this module and never parse a command line

    parser = argparse.ArgumentParser(
        prog="ipledger-verify",
        description="Check an ipledger proof bundle (or a consistency proof) offline against the site's public key.",
        epilog="Examples:\n  ipledger-verify bundle.json --pubkey site.pub\n"
               "  ipledger-verify --consistency c.json --pubkey site.pub",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", nargs="?", help="a proof bundle (ipledger receipt JOB --proof)")
    parser.add_argument("--consistency", metavar="FILE", help="a consistency proof (ipledger consistency)")
    parser.add_argument("--pubkey", required=True, metavar="KEY.pub", help="the site's Ed25519 public key (PEM)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if bool(args.bundle) == bool(args.consistency):
        parser.error("give a BUNDLE or --consistency FILE (one of them)")
    target = args.consistency or args.bundle
    try:
        try:
            with open(args.pubkey, "rb") as f:
                key = load_public_key(f.read(), args.pubkey)
            with open(target, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise Failure(f"{exc.filename}: cannot read: {exc.strerror}") from None
        result = verify_consistency(raw, key) if args.consistency else verify_bundle(raw, key)
    except Failure as exc:
        print(f"FAILED: {_shown(target)}: {_shown(exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"ok": True, **result}, sort_keys=True))
    elif args.consistency and result["trivial"]:
        print(f"OK (trivial): the old head is the empty tree, which every tree extends; this proves nothing about "
              f"the head of {result['new_tree_size']} entries (log {_shown(result['log_id'])}): check against a non-empty "
              f"head you kept")
    elif args.consistency:
        print(f"OK: head of {result['new_tree_size']} entries extends head of {result['old_tree_size']} "
              f"(log {_shown(result['log_id'])})")
    else:
        print(result["receipt_hash"])
        print(f"OK: {result['entries']} entries included in the tree of {result['tree_size']} signed "
              f"{_shown(result['timestamp'])} (log {_shown(result['log_id'])}); receipt recomputed"
              + (f"; site SKU ratings used: {_shown(', '.join(result['site_skus']))}" if result["site_skus"] else ""),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
