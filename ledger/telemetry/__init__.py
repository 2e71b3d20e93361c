"""Telemetry: the one normalised sample model, its storage beside the ledger, and per-device timelines."""
