"""Chain: the append-only, hash-chained ledger and what is written into it.

Entries and their canonical encoding (``entries``, ``canonical``, ``kinds``), the store, its schema and rows
(``store``, ``db``, ``rows``), chain verification and its recorded status (``verify``, ``verify_status``), the
Merkle tree and signed heads (``merkle``, ``heads``), the receipt lines and the operator's facts: contracts,
adjustments, closed months (``receipt_lines``, ``contracts``, ``adjustments``, ``closed``).
May import: ``ledger.base``, ``ledger.proofcheck``.
"""
