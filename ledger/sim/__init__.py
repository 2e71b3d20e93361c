"""Fleet simulator for the demo hall and the accuracy benchmark (see ledger/sim/fleet.py, docs/demo.md)."""

from .fleet import FleetSpec, Simulation, simulate

__all__ = ["FleetSpec", "Simulation", "simulate"]
