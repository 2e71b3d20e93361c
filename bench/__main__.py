"""`python -m bench` (`make bench`): every figure in turn, each appended to docs/performance-history.md and its row
of docs/performance.md updated.

Arguments (``--scale F``, ``--full``, ``--repeat N``, ``--no-write``) are passed to every figure; a figure
that crashes is reported as failed and the others still run. ``--only a,b`` runs a subset.
"""

from __future__ import annotations

import importlib
import sys
import time

from bench import FIGURES
from bench.common import Figure, print_figure, write_doc


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    only = None
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1].split(",")
        del args[i:i + 2]
    failed = []
    t0 = time.time()
    for name in FIGURES:
        if only and name not in only:
            continue
        mod = importlib.import_module(f"bench.{name}")
        print(f"== bench.{name}", flush=True)
        try:
            mod.main(args)
        except Exception as exc:  # noqa: BLE001 - one broken figure must not hide the others
            failed.append(name)
            fig = Figure(key=name, title=mod.TITLE, target=0, floor=None,
                         status=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            print_figure(fig)
            if "--no-write" not in args:
                write_doc(fig)
    print(f"all figures in {time.time() - t0:,.0f} s" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
