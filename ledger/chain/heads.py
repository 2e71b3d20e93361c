"""Signed tree heads: the site's Ed25519 key, checkpoints recorded in the ledger, consistency proofs between
heads, and the `ipledger verify` check of the Merkle tree (docs/proofs.md).

A head is ``{log_id, tree_size, root_hash, timestamp}`` signed with the site's key (the signed bytes are
:func:`ledger.proofcheck.head_message`); ``log_id`` is the SHA-256 of the public key, so a head names the
key that must verify it. ``ipledger checkpoint`` signs the tree as it stands and records the head as a
``tree_head`` entry (with the public key, so `verify` can check every recorded head offline). A key recorded
in the ledger proves nothing about whose key it is: `verify` checks the heads against *pinned* keys when the
caller has them (``verify --pubkey``, config ``trusted_keys``) and says "unpinned" when it has none.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, TYPE_CHECKING

from .lite import text

from . import merkle
from .canonical import format_ts, now_ts
from .db import write_tx
from .entries import Entry, Kind, make_entry
from ..base.fsmodes import UnsafeMode, create_file, read_strict
from ..proofcheck import (
    CONSISTENCY_FORMAT, HEAD_FORMAT, Failure, check_head, head_message, load_public_key, log_id_of, node_hash
)
from .store import append_in, head, iter_entries, lock_chain
from .verify import ChainProblem, Note, VerifyReport

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

PRIVATE_KEY_MODE, PUBLIC_KEY_MODE = 0o600, 0o644


class HeadError(ValueError):
    """A key or head file that cannot be used, as one line naming the file."""


# --- keys ------------------------------------------------------------------------------------------------------

def keygen(out: str | Path) -> tuple[Path, Path, str]:
    """Write a new Ed25519 private key to ``out`` (PEM, mode 0600; never overwrites) and its public key to
    ``out.pub``; returns (private path, public path, log id)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    priv_path, pub_path = Path(out), Path(str(out) + ".pub")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for path, data, mode in ((priv_path, pem, PRIVATE_KEY_MODE), (pub_path, pub, PUBLIC_KEY_MODE)):
        try:
            fd = create_file(path, mode)
        except FileExistsError:
            raise HeadError(f"{path}: already exists; a signing key is never overwritten") from None
        except OSError as exc:
            raise HeadError(f"{path}: cannot create: {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return priv_path, pub_path, log_id_of(key.public_key())


def load_private_key(path: str | Path, euid: int | None = None) -> Any:
    """The site's signing key, from a file only its owner may read or write (no symbolic link; owned by root
    when ``euid``, default this process's, is root): ledger.base.fsmodes.read_strict."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    p = Path(path)
    try:
        raw = read_strict(p, secret=True, euid=os.geteuid() if euid is None else euid)
        key = load_pem_private_key(raw, password=None)
    except UnsafeMode as exc:
        raise HeadError(str(exc)) from None
    except OSError as exc:
        raise HeadError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise HeadError(f"{p}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise HeadError(f"{p}: not an Ed25519 private key")
    return key


def read_public_key(path: str | Path) -> Any:
    p = Path(path)
    try:
        return load_public_key(p.read_bytes(), str(p))
    except OSError as exc:
        raise HeadError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except Failure as exc:
        raise HeadError(str(exc)) from None


def read_pinned_keys(paths: Sequence[str | Path], euid: int | None = None) -> tuple[Any, ...]:
    """The public keys every recorded head must be signed by (``verify --pubkey``, config ``trusted_keys``).
    A pin is only as good as its file: one another user could have written is refused (ledger.base.fsmodes)."""
    keys = []
    for path in paths:
        p = Path(path)
        try:
            raw = read_strict(p, secret=False, euid=os.geteuid() if euid is None else euid, follow=True)
            keys.append(load_public_key(raw, str(p)))
        except UnsafeMode as exc:
            raise HeadError(str(exc)) from None
        except OSError as exc:
            raise HeadError(f"{p}: cannot read: {exc.strerror or exc}") from None
        except Failure as exc:
            raise HeadError(str(exc)) from None
    return tuple(keys)


def public_pem(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


# --- heads -----------------------------------------------------------------------------------------------------

def sign_head(private_key: Any, tree_size: int, root: bytes, timestamp: str) -> dict:
    fields = {"log_id": log_id_of(private_key.public_key()), "tree_size": tree_size, "root_hash": root.hex(),
              "timestamp": timestamp}
    sig = private_key.sign(head_message(fields))
    return {"format": HEAD_FORMAT, "algorithm": "ed25519", **fields, "signature": base64.b64encode(sig).decode()}


def checkpoint_in(conn: Connection, private_key: Any, timestamp: str | None = None) -> dict:
    """Sign the tree as it stands and record the head as a ``tree_head`` entry, in the caller's write
    transaction (the head covers every entry before its own)."""
    lock_chain(conn)
    seq, _ = head(conn)
    size = merkle.tree_size(conn)
    if size != seq:
        size = merkle.sync(conn, seq)
    ts = format_ts(timestamp) if timestamp else now_ts()
    signed = sign_head(private_key, size, merkle.root_at(conn, size), ts)  # type: ignore[arg-type]
    append_in(conn, [head_entry(signed, public_pem(private_key.public_key()))])
    return signed


def checkpoint(engine: Engine, private_key: Any, timestamp: str | None = None) -> dict:
    with write_tx(engine) as conn:
        return checkpoint_in(conn, private_key, timestamp)


def head_entry(signed: Mapping[str, Any], public_key_pem: str) -> Entry:
    return make_entry(Kind.TREE_HEAD, signed["timestamp"], {**signed, "public_key": public_key_pem},
                      source="ipledger.checkpoint")


def read_head(path: str | Path) -> dict:
    import json

    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HeadError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise HeadError(f"{p}: not a JSON tree head ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != HEAD_FORMAT:
        raise HeadError(f"{p}: format is not {HEAD_FORMAT}")
    return data


def recorded_heads(engine_or_conn: Engine | Connection,
                   through_seq: int | None = None) -> Iterator[tuple[int, dict]]:
    """(seq, head payload) of every tree_head entry (through ``through_seq``), oldest first."""
    for ce in iter_entries(engine_or_conn, kinds=[Kind.TREE_HEAD], through_seq=through_seq):
        yield ce.seq, ce.entry.data


def latest_head(conn: Connection, through_seq: int | None = None) -> dict | None:
    """The newest signed head recorded (through ``through_seq``), without its public key."""
    last = None
    for _seq, data in recorded_heads(conn, through_seq):
        last = data
    return None if last is None else {k: v for k, v in last.items() if k != "public_key"}


def check_head_against_ledger(conn: Connection, signed: Mapping[str, Any], public_key: Any, where: str) -> None:
    """The head verifies under the key and its root is this ledger's root at its size."""
    size, root = check_head(dict(signed), public_key, where)
    have = merkle.tree_size(conn)
    if size > have:
        raise HeadError(f"{where}: signs {size} entries but this ledger's tree holds {have}: entries were removed")
    if merkle.root_at(conn, size) != root:
        raise HeadError(f"{where}: this ledger's root at size {size} is not the signed root: an entry at or "
                        f"before {size} was rewritten")


def consistency(engine: Engine, old: Mapping[str, Any], new: Mapping[str, Any], public_key: Any) -> dict:
    """The consistency proof between two signed heads of this ledger, as the file ``ipledger-verify
    --consistency`` reads; both heads are checked against the ledger first."""
    with engine.connect() as conn:
        check_head_against_ledger(conn, old, public_key, "old head")
        check_head_against_ledger(conn, new, public_key, "new head")
        if old["tree_size"] > new["tree_size"]:
            raise HeadError(f"old head signs {old['tree_size']} entries, more than the new head's {new['tree_size']}")
        proof = merkle.consistency_proof(conn, old["tree_size"], new["tree_size"])
    return {"format": CONSISTENCY_FORMAT, "old_head": dict(old), "new_head": dict(new),
            "proof": [p.hex() for p in proof]}


# --- ipledger verify: the tree is the tree of the chain, and every recorded head signs it ----------------------

_LEVEL_SQL = f"SELECT idx, hash FROM {merkle.TABLE} WHERE level = :lv AND idx >= :lo ORDER BY idx LIMIT :n"
_BATCH = 20_000


def _level_rows(conn: Connection, level: int) -> Iterator[tuple[int, bytes]]:
    lo = 0
    while True:
        rows = conn.execute(text(_LEVEL_SQL), {"lv": level, "lo": lo, "n": _BATCH}).fetchall()
        yield from ((int(i), bytes(h)) for i, h in rows)
        if len(rows) < _BATCH:
            return
        lo = int(rows[-1][0]) + 1


def _pairs(hashes: Iterator[bytes]) -> Iterator[bytes]:
    for left in hashes:
        yield node_hash(left, next(hashes))


def _groups(hashes: Iterator[bytes], size: int) -> Iterator[bytes]:
    """The subtree hash of each complete run of ``size`` (a power of two) leaf hashes."""
    while True:
        run = [h for _i, h in zip(range(size), hashes)]
        if len(run) < size:
            return
        yield merkle.perfect_hash(run)


def _leaf_hashes(conn: Connection) -> Iterator[bytes]:
    """Every entry's leaf hash, in seq order, streamed."""
    return (merkle.leaf_hash(merkle.leaf_bytes(ce)) for ce in iter_entries(conn))


def subtree_problems(engine: Engine, entries: int) -> list[ChainProblem]:
    """Every stored subtree hash recomputed: the lowest stored level from the leaves of the (already verified)
    entries, each level above from the one below; the first that differs. Streams, so memory stays flat.
    The readable reference for verify's one-pass check (ledger.chain.verify.verify_chain, ``tree_checked``)."""
    with engine.connect() as conn, engine.connect() as conn2:
        size = merkle.tree_size(conn, entries)
        if size != entries:
            return [ChainProblem(size + 1, "", f"{merkle.TABLE} covers {size} entries but the chain holds {entries}")]
        level, count = merkle.STORED_LEVEL, entries >> merkle.STORED_LEVEL
        below = _groups(_leaf_hashes(conn), 1 << (merkle.STORED_LEVEL - 1))
        while count:
            here = _level_rows(conn2, level)
            for i, want in zip(range(count), _pairs(below)):
                idx, h = next(here, (None, None))
                if idx != i or h != want:
                    first = (i << level) + 1
                    return [ChainProblem(first, "", f"{merkle.TABLE}: subtree (level {level}, index {i}) over "
                                                    f"entries {first}..{(i + 1) << level} does not hash its children")]
            if next(here, None) is not None:
                return [ChainProblem(entries, "", f"{merkle.TABLE}: level {level} holds more subtrees than "
                                                  f"{entries} entries make")]
            below = (h for _i, h in _level_rows(conn, level))
            level, count = level + 1, count // 2
        if next(_level_rows(conn2, level), None) is not None:
            return [ChainProblem(entries, "", f"{merkle.TABLE}: level {level} holds subtrees {entries} entries "
                                              f"do not make")]
    return []


def shape_problems(engine: Engine, entries: int) -> list[ChainProblem]:
    """Every stored row that is not a subtree of the tree the ``entries`` define, named at its level and index
    (a row planted above the top, below the stored levels, or past the end of a level). Such a row is no
    part of any root, so the subtree check never reads it; the append path refuses to extend over it."""
    with engine.connect() as conn:
        size = merkle.tree_size(conn, entries)
        return [ChainProblem(0, "", merkle.outside_reason(k, size)) for k in merkle.outside_nodes(conn, size)]


def head_problems(engine: Engine, pinned: Sequence[Any] = ()) -> list[ChainProblem | Note]:
    """Every signed head recorded in the ledger verifies and signs this ledger's root.

    With ``pinned`` keys (``verify --pubkey``, config ``trusted_keys``) a head must be signed by one of them:
    a head of any other log is a named problem, whatever key its entry recorded. Without, each head is checked
    against the key recorded in its own entry, which a ledger rebuilt and re-signed with a new key also passes:
    a :class:`~ledger.chain.verify.Note` says the heads were checked *unpinned*."""
    problems: list[ChainProblem | Note] = []
    by_log = {log_id_of(k): k for k in pinned}
    checked = 0
    with engine.connect() as conn:
        for seq, data in recorded_heads(conn):
            checked += 1
            where = f"tree_head entry {seq}"
            try:
                if by_log:
                    key = by_log.get(data.get("log_id"))
                    if key is None:
                        raise HeadError(f"{where}: signed by log {str(data.get('log_id'))[:64]}, which is not a "
                                        f"pinned key (pinned: {', '.join(sorted(by_log))}): a head signed by "
                                        f"another key")
                else:
                    key = load_public_key(str(data.get("public_key", "")).encode(), where)
                check_head_against_ledger(conn, {k: v for k, v in data.items() if k != "public_key"}, key, where)
                if data["tree_size"] >= seq:
                    raise HeadError(f"{where} signs {data['tree_size']} entries, its own or later ones")
            except (Failure, HeadError, KeyError, TypeError) as exc:
                problems.append(ChainProblem(seq, "", str(exc)))
    if checked and not by_log:
        problems.append(Note(f"unpinned: {checked} signed tree head{'s' * (checked != 1)} checked only against "
                             f"the keys recorded with them (a ledger rebuilt and re-signed with a new key passes "
                             f"that); pin the site's key with `verify --pubkey` or the config's trusted_keys"))
    return problems


def tree_problems(engine: Engine, entries: int, subtrees_checked: bool = False,
                  pinned: Sequence[Any] = ()) -> list[ChainProblem | Note]:
    """Rows outside the tree, the stored tree against the entries (unless ``subtrees_checked``: verify's chain
    walk already did), then the signed heads against the tree (and the ``pinned`` keys)."""
    return (shape_problems(engine, entries)
            or (subtree_problems(engine, entries) if not subtrees_checked else [])
            or head_problems(engine, pinned))


def check_tree(engine: Engine, report: VerifyReport, pinned: Sequence[Any] = ()) -> list[ChainProblem | Note]:
    """The Merkle tree over the entries, and every signed head recorded in the ledger (signed by a ``pinned``
    key, when there are any)."""
    return tree_problems(engine, report.entries, subtrees_checked=report.tree_checked, pinned=pinned)


def tree_head_at(conn: Connection, through_seq: int) -> dict:
    """What an issued receipt names: the tree at its cut (size and root) and the newest signed head then."""
    return {"tree_size": through_seq, "root_hash": merkle.root_at(conn, through_seq).hex(),
            "signed": latest_head(conn)}
