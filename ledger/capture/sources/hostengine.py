"""Whether DCGM's host engine answers on TCP, where any local user -- a job itself -- can reach it.

`nv-hostengine` listens on 127.0.0.1:5555 without authentication by default; whoever connects can remove a
run's DCGM job record (``dcgmi stats --jremove``) and so blank the evidence of its own bill. docs/slurm.md says
how to run it on a unix socket only root opens, or how to firewall the port. ``ipledger hooks doctor`` asks
:func:`tcp_findings`; run it as an ordinary user to see what a job sees (a firewall rule matching the
connecting user lets root through).
"""

from __future__ import annotations

import socket

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 5555


def tcp_answers(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout: float = 1.0) -> bool:
    """True when a TCP connection to host:port is accepted."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tcp_findings(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout: float = 1.0) -> list[str]:
    """One line per problem (none when the port does not answer)."""
    if not tcp_answers(host, port, timeout):
        return []
    return [f"DCGM host engine port {host}:{port} accepts TCP connections: any process on this node, the job "
            f"itself, can remove a run's DCGM job record (dcgmi stats --jremove); run nv-hostengine "
            f"--domain-socket, or reject other users' connections to the port (docs/slurm.md)"]
