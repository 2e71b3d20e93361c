"""Telemetry: the one normalised sample model, its storage beside the ledger, and per-device timelines.

May import: `ledger.base`, `ledger.chain`, `ledger.method`.
"""
