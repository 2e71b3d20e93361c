"""Capture: what runs on the nodes and writes the local spool.

The Slurm prolog/epilog (``hooks``, standard library only) and the application's progress marks (``marks``),
the vendor tools' answers read at ship time (``sources``), the node collector (``collector``), pods as runs
from the kubelet (``k8s``) and the spool they all write (``spool``).
May import: ``ledger.base``, ``ledger.chain``, ``ledger.telemetry``, ``ledger.importers``.
"""
