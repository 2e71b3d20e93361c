"""Recording shim for tests/test_readonly.py: logs how a fleet tool was called, then answers like the tool.

Called as ``python record.py NAME ARGS...`` by one small wrapper per program name (the test writes them into a
directory that goes first on PATH and into the site config's ``[commands]``). Every call appends one JSON line
``{"program": NAME, "args": [...]}`` to ``$SHIM_LOG`` (under a lock: hooks and the collector may overlap),
then:

* ``dcgmi``, ``nvidia-smi``, ``amd-smi``, ``scontrol``: exec the stand-in of that name in tests/standins/
  (``dcgmi dmon`` prints ``$SHIM_DMON``, a capture the test wrote: the stand-in has no dmon);
* ``sacct``: one ``-P`` line, ``COMPLETED|<now, local time>`` (what reconcile asks for);
* ``squeue``: nothing;
* anything else (the dangerous programs: ``ipmitool``, ``nvidia-settings``, ``scancel`` ...): exit 1 without
  doing anything, so a call to one can only show up in the log.
"""

import fcntl
import json
import os
import sys
import time

STANDINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "standins")


def record(name, args):
    with open(os.environ["SHIM_LOG"], "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps({"program": name, "args": args}) + "\n")


def main(name, args):
    record(name, args)
    if name == "dcgmi" and args[:1] == ["dmon"]:
        with open(os.environ["SHIM_DMON"], encoding="utf-8") as f:
            sys.stdout.write(f.read())
        return 0
    if name in ("dcgmi", "nvidia-smi", "amd-smi", "scontrol"):
        tool = os.path.join(STANDINS, name)
        os.execv(sys.executable, [sys.executable, tool, *args])
    if name == "sacct":
        print("COMPLETED|" + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime()))
        return 0
    if name == "squeue":
        return 0
    print(f"{name}: recording shim, refused", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
