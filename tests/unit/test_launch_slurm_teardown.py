"""The Slurm teardown's logic against stand-in Slurm commands (scripts on PATH; tests/multihost
runs the real Slurm): the sweep after `shoal kill` asks again about a job whose probe step
failed and probes no job that is ending or requeued; the watchdog tries a failed scancel again;
SlurmCommands.cancel says when scancel could not reach slurmctld, and not what it says of ids
that had ended (even with --quiet: exit 1 with nothing said for a step and its job both over,
exit 225 'Invalid job id specified' for a step that ended, as the real scancel does)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shoal.launch.executor import TaskRef
from shoal.launch.slurm import SlurmError
from shoal.launch.slurm_commands import SlurmCommands
from shoal.launch.slurm_sweep import sweep_slurm

WATCHDOG = Path(__file__).resolve().parents[2] / "shoal" / "launch" / "slurm_watchdog.py"


def fake_bin(tmp_path: Path, name: str, script: str) -> dict[str, str]:
    """An environment whose PATH finds `name` as this shell script first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


class ScriptedSlurm(SlurmCommands):
    """squeue's answers for one job, in turn (the last one repeats); records scancel's ids."""

    def __init__(self, env, states):
        super().__init__(env)
        self.states, self.cancelled = list(states), []

    def state(self, job_id):
        answer = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def steps(self, job_id):
        return {f"{job_id}.0"}

    def cancel(self, ids):
        self.cancelled += ids


REFS = [TaskRef("slurm", pid=10, started=1.0, host=node, extra=(("job", "7"), ("step", "7.0")))
        for node in ("n1", "n2")]
TERMINATED = "echo 'srun: error: n1: task 0: Terminated' >&2; exit 143\n"


def test_a_failed_probe_of_a_job_that_ended_meanwhile_reports_its_nodes_clean(tmp_path):
    slurm = ScriptedSlurm(fake_bin(tmp_path, "srun", TERMINATED), ["RUNNING", None])  # salloc ended with shoal
    checks = sweep_slurm(slurm, sys.executable, slurm._env, "job-1", REFS, kill=True)
    assert [(c.host, c.clean, c.note) for c in checks] == [
        (node, True, "Slurm job 7 is over: Slurm ended every process of its steps") for node in ("n1", "n2")]
    assert slurm.cancelled == ["7.0"]


@pytest.mark.parametrize("later", ["RUNNING", SlurmError("squeue: slurm_load_jobs error: Socket timed out")])
def test_a_failed_probe_of_a_job_that_still_runs_or_cannot_be_told_stands(tmp_path, later):
    slurm = ScriptedSlurm(fake_bin(tmp_path, "srun", TERMINATED), ["RUNNING", later])
    checks = sweep_slurm(slurm, sys.executable, slurm._env, "job-1", REFS, kill=False)
    assert [c.error for c in checks] == [f"{node}: the probe step in Slurm job 7 failed (srun: error: n1: task 0:"
                                         " Terminated)" for node in ("n1", "n2")]


@pytest.mark.parametrize("state, said", [
    ("COMPLETING", "Slurm job 7 is completing: Slurm is ending every process of its steps"),
    ("STAGE_OUT", "Slurm job 7 is completing: Slurm is ending every process of its steps"),
    ("REQUEUED", "Slurm job 7 is REQUEUED: Slurm ended every process of its steps"),
    ("PENDING", "Slurm job 7 is PENDING: Slurm ended every process of its steps"),
])
def test_a_job_that_is_ending_or_requeued_is_not_probed(tmp_path, state, said):
    slurm = ScriptedSlurm(fake_bin(tmp_path, "srun", f"touch {tmp_path / 'probed'}; exit 1\n"), [state])
    checks = sweep_slurm(slurm, sys.executable, slurm._env, "job-1", REFS, kill=True)
    assert [(c.clean, c.note) for c in checks] == [(True, said)] * 2
    assert slurm.cancelled == [] and not (tmp_path / "probed").exists()


def test_cancel_says_when_scancel_failed_and_not_when_the_ids_had_ended(tmp_path):
    failing = SlurmCommands(fake_bin(tmp_path, "scancel", "echo 'scancel: error: Unable to contact slurm"
                                                          " controller (connect failure)' >&2; exit 8\n"))
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        failing.cancel(["12.3"])
    SlurmCommands(fake_bin(tmp_path / "ok", "scancel", "exit 0\n")).cancel(["12.3"])
    SlurmCommands(fake_bin(tmp_path / "done", "scancel", "exit 1\n")).cancel(["12.3", "12"])  # ended: quiet, exit 1
    SlurmCommands(fake_bin(tmp_path / "gone", "scancel", "echo 'scancel: error: Kill job error on job step id 12.3:"
                                                         " Invalid job id specified' >&2; exit 225\n")).cancel(["12.3"])


def test_the_watchdog_tries_a_failed_scancel_again_until_it_works(tmp_path):
    calls = tmp_path / "calls"  # scancel fails twice (slurmctld down), then works
    env = fake_bin(tmp_path, "scancel", f'echo "$@" >> {calls}\nif [ "$(wc -l < {calls})" -lt 3 ]; then\n'
                   "  echo 'scancel: error: Kill job error on job id 12: Unable to contact slurm controller' >&2; exit 8\n"
                   "fi\necho 'scancel: error: Kill job error on job step id 12.3: Invalid job id specified' >&2\n"
                   "exit 225\n")  # (the third: as for ids that already ended meanwhile)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-I", str(WATCHDOG)], input=b"+12\n+12.3\n-12.3\n+12.4\n", env=env,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == ["--quiet 12 12.4"] * 3
    assert 3 <= time.monotonic() - started < 20  # after 1 s, then 2 s
