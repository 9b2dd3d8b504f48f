"""The Slurm job's watchdog: a tiny process that cancels what the launcher started in Slurm
when the launcher dies, however it dies (even SIGKILL, which no handler can catch, and which
leaves an srun's step running).

Run as `python -I slurm_watchdog.py` by `slurm_reaper.SlurmReaper`, in its own session, with
the launcher's environment (SLURM_CONF). The launcher writes "+ID" / "-ID" lines on its stdin
as it starts and ends steps ("12.3") or submits and cancels jobs ("12"). On EOF — the launcher
closed the pipe or the kernel did because the launcher died — every id still registered is
scancelled (Slurm TERMs its processes, then KILLs them after KillWait), and it exits.
Standard library only, so it starts fast and imports nothing of Shoal.
"""

import re
import signal
import subprocess
import sys

_ID = re.compile(rb"^[+-](\d+(?:\.\d+)?)$")
_SCANCEL_TIMEOUT = 60


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ids: dict = {}
    for raw in sys.stdin.buffer:
        line = raw.strip()
        match = _ID.match(line)
        if match:
            if line[:1] == b"+":
                ids[match.group(1).decode()] = True
            else:
                ids.pop(match.group(1).decode(), None)
    if not ids:
        return 0
    try:
        subprocess.run(["scancel", "--quiet", *ids], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=_SCANCEL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
