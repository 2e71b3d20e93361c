"""glibc heap settings for one-shot commands whose peak memory is a published figure (``ipledger analyze``).

No effect elsewhere than glibc (each call is a no-op where the library or the call is missing).
"""

from __future__ import annotations

import ctypes
import ctypes.util


def free_large_blocks_at_once() -> None:
    """Have glibc serve every block of 256 KiB or more from its own mapping (``mallopt(M_MMAP_THRESHOLD)``),
    returned to the system when freed: the agents' columns are 1-12 MB arrays allocated and freed in turn,
    which the default (a threshold that rises to 32 MB once such a block is freed) leaves as heap holes
    counted in the process's memory. For a one-shot command such as ``ipledger analyze``; elsewhere a no-op."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(-3, 256 * 1024)   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def keep_large_blocks_in_heap() -> None:
    """Undo :func:`free_large_blocks_at_once` for the rest of the command: blocks below 32 MiB (glibc's own
    ceiling for its moving threshold) come from the heap again, reused when freed instead of mapped, faulted in
    and unmapped each time. For a command that learns its data is small (``ipledger analyze`` of an export whose
    per-sample frame fits its budget: fewer system calls and page faults for a few MiB held). Elsewhere a
    no-op."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(-3, 32 << 20)   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def return_freed_heap() -> None:
    """Hand the heap pages of the released export and the per-device columns back to the system (glibc's
    ``malloc_trim``): they were many small blocks, the samples frame is one large mapping that cannot reuse
    them, so without this their memory stays counted while the agents run. Elsewhere a no-op."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
