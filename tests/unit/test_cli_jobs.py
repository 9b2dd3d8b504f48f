"""Commands on recorded jobs, in-process: references by name after two runs, by number
and as `12.worker.1`; the newest job when none is given; `status --running/--all/--last`;
`prune`; the directory `tensorboard` serves."""

import json
import os
import stat
import subprocess
from pathlib import Path

from shoal.cli.exit_codes import ExitCode
from shoal.launch.ports import free_ports
from shoal.launch.states import JobState

from tests.unit.cli_harness import Captured, record_job


def test_logs_by_name_after_two_runs_prints_the_newest_job(tmp_path):
    shoal = Captured(tmp_path)
    record_job(shoal, "job-20260101-100000-aaaa", "job")
    record_job(shoal, "job-20260101-100001-bbbb", "job")
    assert shoal("logs", "job") == ExitCode.OK, shoal.err.getvalue()
    assert shoal.text() == "job.worker.0 | job-20260101-100001-bbbb worker.0 says hi\n"


def test_logs_kill_monitor_default_to_the_newest_job(tmp_path):
    shoal = Captured(tmp_path)
    record_job(shoal, "a-1", "a")
    record_job(shoal, "b-1", "b")
    assert shoal("logs") == ExitCode.OK, shoal.err.getvalue()
    assert shoal.text() == "b.worker.0 | b-1 worker.0 says hi\n"
    shoal = Captured(tmp_path)
    assert shoal("monitor", "--once") == ExitCode.OK, shoal.err.getvalue()
    assert shoal.out.getvalue().startswith("job b-1  SUCCEEDED")
    shoal = Captured(tmp_path)
    assert shoal("kill") == ExitCode.OK, shoal.err.getvalue()
    assert shoal.out.getvalue().startswith("job b-1 had ended already: SUCCEEDED")


def test_logs_by_number_and_task_reference(tmp_path):
    shoal = Captured(tmp_path)
    record_job(shoal, "a-1", "a", workers=2)
    record_job(shoal, "b-1", "b")
    assert shoal("logs", "1.worker.1") == ExitCode.OK, shoal.err.getvalue()
    assert shoal.text() == "a-1 worker.1 says hi\n"
    shoal = Captured(tmp_path)
    assert shoal("logs", "1") == ExitCode.OK
    assert shoal.text().splitlines() == ["a.worker.0 | a-1 worker.0 says hi",
                                         "a.worker.1 | a-1 worker.1 says hi"]
    shoal = Captured(tmp_path)
    assert shoal("logs", "1", "--task", "worker:1") == ExitCode.OK, shoal.err.getvalue()  # the runtime's spelling
    assert shoal.text() == "a-1 worker.1 says hi\n"


def test_status_shows_numbers_and_recent_jobs_by_default(tmp_path):
    shoal = Captured(tmp_path)
    record_job(shoal, "r-1", "r", running=True)
    for i in range(12):
        record_job(shoal, f"d-{i:02d}", "d")
    assert shoal("status") == ExitCode.OK
    lines = shoal.out.getvalue().splitlines()
    assert lines[0].split()[:3] == ["#", "ID", "NAME"]
    assert lines[1].split()[:2] == ["13", "d-11"]
    shown = [line.split()[1] for line in lines[1:-1]]
    assert len(shown) == 11 and shown[-1] == "r-1"  # 10 newest, and the running one
    assert lines[-1].startswith("2 older finished jobs not shown: shoal status --all")


def test_status_running_all_and_last(tmp_path):
    shoal = Captured(tmp_path)
    record_job(shoal, "r-1", "r", running=True)
    record_job(shoal, "d-1", "d")
    record_job(shoal, "d-2", "d", state=JobState.FAILED)

    def ids(*flags):
        run = Captured(tmp_path)
        assert run("status", "--json", *flags) == ExitCode.OK, run.err.getvalue()
        return [job["id"] for job in json.loads(run.out.getvalue())]

    assert ids("--running") == ["r-1"]
    table = Captured(tmp_path)
    assert table("status", "--running") == ExitCode.OK
    assert "not shown" not in table.out.getvalue()  # --running asked for running jobs only
    assert ids("--all") == ["d-2", "d-1", "r-1"]
    assert ids("--last", "1") == ["d-2"]
    one = Captured(tmp_path)
    assert one("status", "d-1", "--running") == ExitCode.USAGE  # not the one job, silently
    assert "drop --running (shoal status d-1)" in one.err.getvalue()


def test_check_of_a_running_job_whose_launcher_is_gone_says_so(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait(10)
    shoal = Captured(tmp_path)
    record_job(shoal, "r-1", "r", running=True, launcher_pid=gone.pid)
    assert shoal("check", "r-1") == ExitCode.OK, shoal.err.getvalue()
    assert shoal.out.getvalue().startswith(f"job r-1's launcher (pid {gone.pid}) is gone, so nothing of the job"
                                           " should run; checking")
    alive = Captured(tmp_path)
    record_job(alive, "r-2", "r", running=True)
    assert alive("check", "r-2") == ExitCode.OK, alive.err.getvalue()
    assert alive.out.getvalue().startswith("job r-2 is RUNNING: its tasks are meant to run; checking anyway")


def test_prune_removes_finished_jobs_files_and_records_but_not_running_ones(tmp_path):
    shoal = Captured(tmp_path)
    running = record_job(shoal, "r-1", "r", running=True)
    old = record_job(shoal, "d-1", "d")
    kept = record_job(shoal, "d-2", "d")
    outside = tmp_path / "my-model"
    elsewhere = record_job(shoal, "d-3", "d", output_dir=str(outside))
    shoal = Captured(tmp_path)
    assert shoal("prune", "--keep", "1") == ExitCode.OK, shoal.err.getvalue()
    assert "d-1" in shoal.out.getvalue() and "d-2" in shoal.out.getvalue()
    assert not Path(old.job_dir).exists() and not Path(kept.job_dir).exists()
    assert Path(elsewhere.job_dir).exists() and Path(running.job_dir).exists()
    assert outside.exists()
    status = Captured(tmp_path)
    assert status("status", "--json", "--all") == 0
    assert [job["id"] for job in json.loads(status.out.getvalue())] == ["d-3", "r-1"]
    shoal = Captured(tmp_path)
    assert shoal("prune") == ExitCode.OK
    assert not Path(elsewhere.job_dir).exists() and outside.exists()  # not the output_dir
    assert "left" in shoal.out.getvalue() and str(outside) in shoal.out.getvalue()
    assert Path(running.job_dir).exists()


def test_prune_older_than_and_dry_run(tmp_path):
    shoal = Captured(tmp_path)
    fresh = record_job(shoal, "d-1", "d")
    shoal = Captured(tmp_path)
    assert shoal("prune", "--older-than", "1h") == ExitCode.OK
    assert Path(fresh.job_dir).exists() and "nothing to prune" in shoal.out.getvalue()
    shoal = Captured(tmp_path)
    assert shoal("prune", "--dry-run") == ExitCode.OK
    assert "would remove" in shoal.out.getvalue() and Path(fresh.job_dir).exists()


def test_prune_never_removes_a_folder_outside_the_jobs_folder(tmp_path):
    shoal = Captured(tmp_path)
    record_job(shoal, "d-1", "d")
    victim = tmp_path / "precious"
    victim.mkdir()
    import sqlite3
    db = sqlite3.connect(shoal.home / "jobs.db")
    db.execute("UPDATE jobs SET job_dir = ? WHERE id = 'd-1'", (str(victim),))
    db.commit()
    db.close()
    assert shoal("prune") == ExitCode.OK
    assert victim.exists()


def fake_tensorboard(tmp_path: Path) -> Path:
    """A `tensorboard` on PATH that writes its arguments to args.json and exits."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "tensorboard"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'args.txt'}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_tensorboard_serves_the_directory_the_tasks_reported(tmp_path):
    bin_dir = fake_tensorboard(tmp_path)
    shoal = Captured(tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    plan = record_job(shoal, "t-1", "t", workers=2)
    wrote = tmp_path / "elsewhere"
    (wrote / "worker_1").mkdir(parents=True)
    with shoal.env.store() as store:
        store.set_summaries("t-1", "worker.0", str(wrote))
        store.set_summaries("t-1", "worker.1", str(wrote / "worker_1"))
    assert shoal("tensorboard", "--port", str(free_ports(1)[0])) == ExitCode.OK, shoal.err.getvalue()
    args = (tmp_path / "args.txt").read_text().split()
    assert args[:2] == ["--logdir", str(wrote)] and plan.model_dir not in args


def test_tensorboard_on_a_port_in_use_says_so_before_it_starts(tmp_path):
    import socket
    bin_dir = fake_tensorboard(tmp_path)
    shoal = Captured(tmp_path, PATH=str(bin_dir))
    record_job(shoal, "t-1", "t")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert shoal("tensorboard", "--port", str(port)) == ExitCode.USAGE
    assert f"cannot serve on 127.0.0.1:{port} (Address already in use); pick another port" in shoal.err.getvalue()
    assert shoal.out.getvalue() == "" and not (tmp_path / "args.txt").exists()


def test_tensorboard_without_reports_serves_the_model_dir(tmp_path):
    bin_dir = fake_tensorboard(tmp_path)
    shoal = Captured(tmp_path, PATH=str(bin_dir))
    plan = record_job(shoal, "t-1", "t")
    assert shoal("tensorboard", "t", "--port", str(free_ports(1)[0])) == ExitCode.OK, shoal.err.getvalue()
    assert (tmp_path / "args.txt").read_text().split()[:2] == ["--logdir", plan.model_dir]


def test_tensorboard_with_unrelated_directories_names_each_task(tmp_path):
    bin_dir = fake_tensorboard(tmp_path)
    shoal = Captured(tmp_path, PATH=str(bin_dir))
    record_job(shoal, "t-1", "t", workers=2)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with shoal.env.store() as store:
        store.set_summaries("t-1", "worker.0", str(tmp_path / "a"))
        store.set_summaries("t-1", "worker.1", str(tmp_path / "b"))
    assert shoal("tensorboard", "1", "--port", str(free_ports(1)[0])) == ExitCode.OK, shoal.err.getvalue()
    args = (tmp_path / "args.txt").read_text().split()
    assert args[:2] == ["--logdir_spec",
                        f"worker.0:{tmp_path / 'a'},worker.1:{tmp_path / 'b'}"]


def test_prune_keeps_a_finished_jobs_folder_that_a_running_job_trains_in(tmp_path):
    shoal = Captured(tmp_path)
    old = record_job(shoal, "d-1", "d")
    model = Path(old.job_dir) / "model"
    running = record_job(shoal, "r-1", "r", running=True, output_dir=str(model))  # resumes d-1's model
    shoal = Captured(tmp_path)
    assert shoal("prune") == ExitCode.OK, shoal.err.getvalue()
    assert Path(old.job_dir).exists() and Path(running.job_dir).exists()
    assert f"left {old.job_dir}" in shoal.out.getvalue(), shoal.out.getvalue()


def test_running_counts_leave_out_tasks_moved_or_scaled_down_on_purpose():
    from shoal.launch.states import TaskState, running_of
    states = [TaskState.RUNNING, TaskState.RUNNING, TaskState.MOVED, TaskState.RUNNING, TaskState.SCALED_DOWN]
    assert running_of(states) == "3/3 running"  # worker:1 moved (worker:2 runs instead), one scaled down
    assert running_of([TaskState.RUNNING, TaskState.FAILED, TaskState.RESTARTING]) == "1/3 running"


def test_kill_without_a_job_picks_the_newest_running_job_not_a_newer_finished_one(tmp_path):
    from shoal.launch.job_refs import find_running_job
    shoal = Captured(tmp_path)
    record_job(shoal, "a-1", "a", running=True)
    record_job(shoal, "b-1", "b", state=JobState.FAILED)  # newer, already over
    with shoal.env.store() as store:
        assert find_running_job(store, None).id == "a-1"
        assert find_running_job(store, "b").id == "b-1"
        store.set_job_state("a-1", JobState.KILLED, "test", ended=True)
        assert find_running_job(store, None).id == "b-1"  # none runs: the newest, as before


def test_monitor_and_scale_without_a_job_take_the_newest_running_job_not_a_newer_finished_one(tmp_path):
    shoal = Captured(tmp_path)
    record_job(shoal, "a-1", "a", running=True)
    record_job(shoal, "b-1", "b")  # newer, already over
    assert shoal("monitor", "--once") == ExitCode.OK, shoal.err.getvalue()
    assert shoal.out.getvalue().startswith("job a-1  RUNNING"), shoal.out.getvalue()
    shoal = Captured(tmp_path)
    assert shoal("scale", "worker=2", "--timeout", "1") != ExitCode.USAGE
    assert "a-1" in shoal.err.getvalue() and "ROLE=N" not in shoal.err.getvalue(), shoal.err.getvalue()
    shoal = Captured(tmp_path)
    assert shoal("scale", "a", "worker=2", "ps=2") == ExitCode.USAGE
    assert "give JOB and one ROLE=N, not 3 words" in shoal.err.getvalue()
