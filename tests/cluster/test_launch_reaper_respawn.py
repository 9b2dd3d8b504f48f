"""The job's watchdog process (the reaper) is replaced when it dies while the launcher runs, and
its successor knows every process group: a later death of the launcher still stops the tasks.
Before, a reaper killed by the OOM killer went unnoticed and a later SIGKILL of the launcher
left the tasks' children running."""

import logging
import os
import signal
import subprocess
import time

from shoal.launch.local_reaper import Reaper


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_reaper_that_dies_is_replaced_and_its_successor_stops_the_groups_when_the_launcher_goes(caplog):
    caplog.set_level(logging.WARNING, logger="shoal.launch.watchdog_pipe")
    task = subprocess.Popen(["sleep", "60"], start_new_session=True)
    reaper = Reaper(grace=1.0)
    try:
        reaper.start()
        reaper.add(task.pid)
        first = reaper._proc.pid
        os.kill(first, signal.SIGKILL)  # the OOM killer, say

        def replaced() -> bool:
            return any(f"watchdog process (pid {first}) died (exit -9); started a new one" in r.getMessage()
                       and "told it the 1 thing the old one watched" in r.getMessage() for r in caplog.records)

        wait_until(replaced, 10, "a new reaper, and the warning that says so")
        assert reaper.respawns == 1 and reaper._proc.pid != first
        assert group_alive(task.pid)  # the replacement kills nothing while the launcher lives
        with reaper._lock:  # the launcher dies: its threads with it (no respawn), and the kernel closes the pipe
            successor, reaper._proc = reaper._proc, None
        successor.stdin.close()
        wait_until(lambda: task.poll() is not None, 10, "the new reaper to stop the task's group")
        successor.wait(10)
    finally:
        reaper.close(timeout=5)
        if task.poll() is None:
            os.killpg(task.pid, signal.SIGKILL)
        task.wait(5)
