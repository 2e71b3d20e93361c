"""Offline verifier of ipledger proofs: a tenant checks a receipt without the operator's database.

One file, the standard library and ``cryptography`` only, so a tenant can copy it alone into any Python 3.11+
environment (docs/proofs.md)::

    python proofcheck.py bundle.json --pubkey site.pub              # a receipt bundle
    python proofcheck.py --consistency c.json --pubkey site.pub     # two signed tree heads of one log

A bundle is checked in this order, and the first thing that fails is named (exit status 1):

1. the bundle is in its one canonical spelling (so no byte of it can change unnoticed);
2. the signed tree head verifies under the public key the tenant holds, and names that key's log;
3. every bundled entry is included in that tree (RFC 9162 inclusion proof from its leaf hash);
4. every bundled block of samples hashes to the digest its (included) telemetry segment entry sealed;
5. the receipt recomputed from those entries and samples with the reference implementation of the method
   below is exactly the bundled receipt, and its hash is printed.

The ledger itself uses the hashing, proof and signature functions of this module (``ledger.merkle``), so the
operator's and the tenant's code cannot drift apart; the reference method is deliberately a second,
plain-Python implementation of docs/method.md (no numpy), and tests compare it with the ledger's.
This module never imports ``ledger``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Callable, Iterable, Mapping, Sequence

BUNDLE_FORMAT = "ipledger-proof-bundle/1"
CONSISTENCY_FORMAT = "ipledger-consistency/1"
HEAD_FORMAT = "ipledger-tree-head/1"
HEAD_DOMAIN = b"ipledger-tree-head-v1\n"  # signed bytes = this prefix + canonical JSON of the four head fields
HEAD_FIELDS = ("log_id", "root_hash", "timestamp", "tree_size")
HASH_DOMAIN = "ipledger-entry-hash-v1"


class Failure(Exception):
    """A check that did not hold; its text names what failed."""


# --- canonical JSON (the one byte form every hash is taken over; same as ledger/canonical.py) ----------------

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
    if old_size == 0:
        return  # every tree extends the empty one
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
    if not isinstance(head["timestamp"], str):
        raise Failure(f"{where}.timestamp: expected RFC 3339 text")
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
