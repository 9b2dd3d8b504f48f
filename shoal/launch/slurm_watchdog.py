"""The Slurm job's watchdog: a tiny process that cancels what the launcher started in Slurm
when the launcher dies, however it dies (even SIGKILL, which no handler can catch, and which
leaves an srun's step running).

Run as `python -I slurm_watchdog.py` by `slurm_reaper.SlurmReaper`, in its own session, with
the launcher's environment (SLURM_CONF). The launcher writes "+ID" / "-ID" lines on its stdin
as it starts and ends steps ("12.3") or submits and cancels jobs ("12"), and "+name:NAME" /
"-name:NAME" while it submits a job whose id sbatch has not said yet. On EOF — the launcher
closed the pipe or the kernel did because the launcher died — every id still registered is
scancelled (Slurm TERMs its processes, then KILLs them after KillWait), then every job of a
name still registered, again each second for NAME_WINDOW_S (15 s: an sbatch the launcher's death
cut short may have reached slurmctld all the same, and slurmctld may create the job a moment
later); then it exits. A scancel that cannot reach slurmctld (down or not answering: the steps and jobs
run on meanwhile, as the agents cannot tell that the launcher died while srun's I/O holds) is
run again, after 1, 2, 4 ... at most 30 s, for up to RETRY_S (30 min).
Standard library only, so it starts fast and imports nothing of Shoal.
"""

import re
import signal
import subprocess
import sys
import time

_ID = re.compile(rb"^[+-](\d+(?:\.\d+)?|name:shoal-[A-Za-z0-9][A-Za-z0-9_.-]{0,62}-[0-9a-f]{8})$")
_SCANCEL_TIMEOUT = 60
NAME_WINDOW_S = 15.0
"""How long names are cancelled again: past slurmctld's default MessageTimeout (10 s), within
which an sbatch request already sent may still create its job."""


RETRY_S = 1800.0
"""How long a scancel that fails is tried again."""


UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Communication connection failure")
"""What scancel says when slurmctld does not answer (as shoal.launch.slurm_commands.UNREACHABLE)."""


def _scancel(args: list) -> bool:
    """scancel ARGS, quietly; False if it could not run, took too long or could not reach
    slurmctld. Ids that already ended are no failure, whatever scancel says of them."""
    try:
        done = subprocess.run(["scancel", "--quiet", *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, errors="replace", timeout=_SCANCEL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return not any(words in done.stderr for words in UNREACHABLE)


def _cancelled(args: list, deadline: float) -> bool:
    """scancel ARGS, again after a failure (1, 2, 4 ... at most 30 s later) until it works or
    `deadline` (monotonic) passes; whether it worked."""
    delay = 1.0
    while not _scancel(args):
        if time.monotonic() + delay >= deadline:
            return False
        time.sleep(delay)
        delay = min(30.0, delay * 2)
    return True


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    registered: dict = {}
    for raw in sys.stdin.buffer:
        line = raw.strip()
        match = _ID.match(line)
        if match:
            if line[:1] == b"+":
                registered[match.group(1).decode()] = True
            else:
                registered.pop(match.group(1).decode(), None)
    names = [i[len("name:"):] for i in registered if i.startswith("name:")]
    ids = [i for i in registered if not i.startswith("name:")]
    deadline = time.monotonic() + RETRY_S
    ok = _cancelled(ids, deadline) if ids else True
    until = time.monotonic() + NAME_WINDOW_S
    while names:
        ok = all([_cancelled([f"--name={name}"], deadline) for name in names]) and ok
        if time.monotonic() >= until:
            break
        time.sleep(1.0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
