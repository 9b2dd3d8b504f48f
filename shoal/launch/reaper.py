"""The job's watchdog: a tiny process that kills the job's process groups when the
launcher dies, however it dies (even SIGKILL, which no handler can catch).

Run as `python -I reaper.py GRACE` by `local_reaper.Reaper`, in its own session. The
launcher writes "+PGID" / "-PGID" lines on its stdin as task groups come and go. On EOF —
the launcher closed the pipe or the kernel did because the launcher died — every group
still registered gets SIGTERM, then SIGKILL after GRACE seconds, and the reaper exits.
Standard library only, so it starts fast and imports nothing of Shoal.
"""

import os
import signal
import sys
import time


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def _signal_all(groups: set, sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    grace = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    groups: set = set()
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if line[:1] in (b"+", b"-") and line[1:].isdigit():
            pgid = int(line[1:])
            if line[:1] == b"+" and pgid > 1:
                groups.add(pgid)
            else:
                groups.discard(pgid)
    if not groups:
        return 0
    _signal_all(groups, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(g) for g in groups):
        time.sleep(0.05)
    _signal_all(groups, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
