"""The Slurm executor end to end, on the real local Slurm of tests/multihost (nodes n1 and n2):
`shoal` runs as a real process, inside an allocation (SLURM_JOB_ID) or with `--slurm`, its tasks
run as processes of agent steps, and after every test nothing is left: no step, no job it
submitted, no task and no grandchild of a task."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from shoal.launch.ports import free_ports
from tests.multihost import procs
from tests.multihost.slurm import CPUS_PER_NODE, NODES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch_programs"))
from harness import alive, cleanup, grandchild_pids, recorded_pids  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SERVE = ["python", "tests/launch_programs/serve.py", "--fork", "--lifetime", "120"]
WAIT_S = 60


def shoal_env(slurm_cluster, home: Path, **extra: str) -> dict[str, str]:
    env = slurm_cluster.env  # SLURM_CONF of the test cluster, no outer SLURM_* variables
    env.update(SHOAL_HOME=str(home), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])), **extra)
    env.pop("TF_CONFIG", None)
    return env


def shoal(*args: str) -> list[str]:
    return [sys.executable, "-m", "shoal.cli.main", *args]


def run(env: dict[str, str], argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=timeout)


def start(env: dict[str, str], argv: list[str]) -> subprocess.Popen:
    """A launcher in its own session, as if started in another terminal."""
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def status(env: dict[str, str]) -> list[dict]:
    out = run(env, shoal("status", "--json"), timeout=60)
    assert out.returncode == 0, out.stdout
    return json.loads(out.stdout)


def wait_running(env: dict[str, str], launcher: subprocess.Popen, tasks: int) -> dict:
    """Wait until the job records `tasks` tasks RUNNING and each has printed its first line."""
    def ready():
        if launcher.poll() is not None:
            raise AssertionError(f"the launcher exited {launcher.returncode}: {launcher.stdout.read().decode()}")
        jobs = status(env)
        if not jobs or [t["state"] for t in jobs[0]["tasks"]].count("RUNNING") != tasks:
            return False
        return all(Path(t["log_path"]).exists() and Path(t["log_path"]).read_text() for t in jobs[0]["tasks"])
    procs.wait_until(ready, timeout=WAIT_S, what=f"{tasks} tasks running", interval=0.3)
    return status(env)[0]


def allocation(slurm_cluster, nodes: int = 2, tasks: int = 4) -> str:
    """A user's allocation, as `salloc` gives one, left running without a shell; its job id."""
    out = slurm_cluster.run(["salloc", "--no-shell", f"--nodes={nodes}", f"--ntasks={tasks}"], timeout=60)
    return re.search(r"Granted job allocation (\d+)", out.stderr + out.stdout).group(1)


def steps(slurm_cluster, job: str) -> list[str]:
    """Ids of the steps of `job` that still run (its batch step aside)."""
    out = slurm_cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], timeout=30, check=False).stdout.split()
    return [s for s in out if not s.endswith(".batch")]


def long_job_in_an_allocation(slurm_cluster, tmp_path: Path) -> tuple[Path, str, dict[str, str], subprocess.Popen]:
    """A user's allocation (its job id) and, started in it, a long 1 ps + 2 workers job:
    (SHOAL_HOME, allocation, environment, launcher)."""
    home = tmp_path / "home"
    job = allocation(slurm_cluster)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    return home, job, env, start(env, shoal("run", "--name", "long", "--ps", "1", "--workers", "2", "--", *SERVE))


def unreachable_conf(slurm_cluster, tmp_path: Path) -> str:
    """A copy of the cluster's slurm.conf whose slurmctld port nothing listens on: every Slurm
    client command run with it fails, as against a slurmctld that is down."""
    conf = tmp_path / "unreachable.conf"
    port = free_ports(1)[0]
    conf.write_text(re.sub(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={port}", slurm_cluster.conf.read_text()))
    return str(conf)


def nothing_left(home: Path) -> bool:
    return not alive(recorded_pids(home)) and not alive(grandchild_pids(home))


@pytest.mark.timeout(300)
def test_seed_job_succeeds_inside_salloc_with_tasks_on_both_nodes(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    try:
        out = run(env, ["salloc", "--nodes=2", "--ntasks=4",
                        *shoal("train", "examples/mnist.yaml", "-p", "steps=200")], timeout=240)
        assert out.returncode == 0, out.stdout
        for index in (0, 1):
            lines = [line for line in out.stdout.splitlines() if line.startswith(f"mnist.worker.{index} | ")]
            assert lines[-1].startswith(f"mnist.worker.{index} | accuracy: 0.")
        [job] = status(env)
        assert job["state"] == "SUCCEEDED"
        where = {t["name"]: t["detail"] for t in job["tasks"]}
        running = [line for line in out.stdout.splitlines() if "STARTING -> RUNNING" in line]
        assert any(line.endswith(" on n1)") for line in running) and any(line.endswith(" on n2)") for line in running)
        assert set(where) == {"ps.0", "ps.1", "worker.0", "worker.1"}
        procs.wait_until(lambda: not slurm_cluster.job_ids(), timeout=WAIT_S, what="salloc's job gone")
        assert nothing_left(home)
    finally:
        cleanup(home)


@pytest.mark.timeout(300)
def test_seed_job_succeeds_from_a_batch_script(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    output = tmp_path / "batch.out"
    try:
        submitted = run(env, ["sbatch", "--parsable", "--nodes=2", "--ntasks=4", f"--output={output}",
                              f"--wrap={shlex.join(shoal('train', 'examples/mnist.yaml', '-p', 'steps=200'))}"],
                        timeout=60)
        assert submitted.returncode == 0, submitted.stdout
        procs.wait_until(lambda: not slurm_cluster.job_ids(), timeout=240, what="the batch job done", interval=0.5)
        text = output.read_text()
        assert "mnist.worker.1 | accuracy: 0." in text and "SUCCEEDED (all training tasks succeeded)" in text, text
        assert status(env)[0]["state"] == "SUCCEEDED"
        assert nothing_left(home)
    finally:
        cleanup(home)


@pytest.mark.timeout(300)
def test_seed_job_succeeds_with_slurm_flag_and_its_job_is_gone_when_shoal_returns(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    try:
        out = run(env, shoal("train", "examples/mnist.yaml", "-p", "steps=200", "--slurm"), timeout=240)
        assert out.returncode == 0, out.stdout
        assert re.search(r"submitted Slurm job \d+", out.stdout)
        assert "mnist.worker.0 | accuracy: 0." in out.stdout
        assert status(env)[0]["state"] == "SUCCEEDED"
        assert slurm_cluster.job_ids() == []  # teardown scancelled it and waited
        assert nothing_left(home)
    finally:
        cleanup(home)


@pytest.mark.timeout(300)
def test_job_in_an_allocation_ends_its_steps_and_leaves_the_allocation_running(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    job = allocation(slurm_cluster)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    try:
        out = run(env, shoal("run", "--ps", "1", "--workers", "2", "--", "python", "tests/launch_programs/work.py"))
        assert out.returncode == 0, out.stdout
        assert steps(slurm_cluster, job) == []
        assert slurm_cluster.job_ids() == [job]  # the user's allocation is theirs to end
        assert nothing_left(home)
    finally:
        cleanup(home)


@pytest.mark.timeout(300)
def test_restarted_task_keeps_its_identity_under_slurm(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    job = allocation(slurm_cluster)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    try:
        out = run(env, shoal("run", "--workers", "2", "--restart", "on-failure", "--max-restarts", "2",
                             "--backoff", "0.2s", "--", "python", "tests/launch_programs/flaky.py"))
        assert out.returncode == 0, out.stdout
        for index in (0, 1):
            configs = re.findall(rf"job\.worker\.{index} \| attempt \d TF_CONFIG (.*)", out.stdout)
            assert len(configs) == 2 and configs[0] == configs[1]
        assert {t["restarts"] for t in status(env)[0]["tasks"]} == {1}
        assert steps(slurm_cluster, job) == []
    finally:
        cleanup(home)


def restartable_job_in_an_allocation(slurm_cluster, tmp_path: Path, name: str):
    """A user's allocation and, started in it, a 1 ps + 2 workers job restarted on failure,
    its output in a file (nothing reads a pipe while it runs): (SHOAL_HOME, allocation,
    environment, launcher, output file)."""
    home = tmp_path / "home"
    job = allocation(slurm_cluster)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: {name}\nrun: python examples/mnist_softmax.py --steps 30000 --log_every 10000\n"
                    "roles: {ps: {count: 1}, worker: {count: 2}}\n"
                    "restart: {policy: on-failure, max_restarts: 3, backoff: 1s}\n")
    output = tmp_path / "launcher.out"
    with output.open("wb") as sink:
        launcher = subprocess.Popen(shoal("train", str(spec)), cwd=REPO, env=env, stdout=sink,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    return home, job, env, launcher, output


@pytest.mark.timeout(300)
def test_task_restarts_in_a_new_agent_step_when_its_nodes_srun_is_killed(slurm_cluster, tmp_path):
    home, job, env, launcher, output = restartable_job_in_an_allocation(slurm_cluster, tmp_path, "lost")
    try:
        wait_running(env, launcher, 3)
        listed = slurm_cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %N"], timeout=30).stdout.split("\n")
        [n2_step] = [line.split()[0] for line in listed if line.split()[1:] == ["n2"]]
        [srun] = [p for p in psutil.Process(launcher.pid).children()
                  if p.name() == "srun" and "--nodelist=n2" in p.cmdline()]
        srun.kill()  # n2's agent step loses its launcher end; Slurm keeps the step running
        assert launcher.wait(180) == 0, output.read_text()[-4000:]
        text = output.read_text()
        on_n2 = set(re.findall(r"^shoal \| lost\.(\S+): STARTING -> RUNNING \(pid \d+ on n2\)$", text, re.M))
        assert on_n2 and "lost the agent on n2" in text, text[-4000:]
        for task in on_n2:
            assert re.search(rf"^shoal \| n2: its agent \(step {re.escape(n2_step)}\) was lost; started step"
                             rf" {job}\.\d+ to restart {task}$", text, re.M), text[-4000:]
        [record] = status(env)
        assert record["state"] == "SUCCEEDED"
        assert {t["name"]: t["restarts"] for t in record["tasks"]} == \
            {t["name"]: int(t["name"] in on_n2) for t in record["tasks"]}
        assert steps(slurm_cluster, job) == []  # the lost step and its replacement: both gone
        assert slurm_cluster.job_ids() == [job]
        procs.wait_until(lambda: nothing_left(home), timeout=WAIT_S, what="every task and grandchild gone")
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_an_allocation_cancelled_from_outside_fails_the_job_saying_so_not_as_a_program_that_cannot_start(
        slurm_cluster, tmp_path):
    home, job, env, launcher, output = restartable_job_in_an_allocation(slurm_cluster, tmp_path, "gone")
    try:
        wait_running(env, launcher, 3)
        slurm_cluster.run(["scancel", job], timeout=30)  # an admin, or the user in another terminal
        launcher.wait(120)
        text = output.read_text()
        [record] = status(env)
        assert record["state"] == "FAILED", text[-4000:]
        assert launcher.returncode not in (0, 127), (launcher.returncode, record["reason"], text[-4000:])  # the tasks
        # failed; no program failed to start
        assert re.search(rf"cannot be restarted on n[12]: Slurm job {job} is (CANCELLED|COMPLETING|over) \(scancel,"
                         rf" its time limit, a node failure, preemption or a requeue ended it: sacct -j {job} says which\), so"
                         " nothing can run in it any more", record["reason"]), record["reason"]
        procs.wait_until(lambda: nothing_left(home), timeout=WAIT_S, what="every task and grandchild gone")
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_a_submitted_job_that_slurm_requeues_fails_saying_so_and_does_not_run_again(slurm_cluster, tmp_path):
    """`scontrol requeue` (what preemption with requeue does): Slurm ends the steps with SIGTERM
    and would run the job again; the failure names the Slurm job's state, and the launcher
    cancels the requeued job as it stops."""
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    launcher = start(env, shoal("run", "--name", "requeued", "--slurm", "--ps", "1", "--workers", "2", "--", *SERVE))
    try:
        wait_running(env, launcher, 3)
        [job] = slurm_cluster.job_ids()
        slurm_cluster.run(["scontrol", "requeue", job], timeout=30)
        assert launcher.wait(120) != 0
        [record] = status(env)
        assert record["state"] == "FAILED", launcher.stdout.read().decode()[-4000:]
        assert re.search(rf"failed \(killed by SIG(TERM|KILL); Slurm job {job} is [A-Z_]+ \(scancel, its time limit, a"
                         rf" node failure, preemption or a requeue ended it: sacct -j {job} says which\)",
                         record["reason"]), record["reason"]
        procs.wait_until(lambda: nothing_left(home), timeout=WAIT_S, what="every task and grandchild gone")
        time.sleep(3)  # a requeued job not cancelled is PENDING again by now, and would start
        assert slurm_cluster.job_ids() == []
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_shoal_kill_leaves_squeue_empty_and_no_task_behind(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    launcher = start(env, shoal("run", "--name", "long", "--slurm", "--ps", "1", "--workers", "2", "--", *SERVE))
    try:
        job = wait_running(env, launcher, 3)
        assert len(grandchild_pids(home)) == 3 and len(slurm_cluster.job_ids()) == 1
        out = run(env, shoal("kill", job["id"]), timeout=90)
        assert out.returncode == 0 and "KILLED" in out.stdout, out.stdout
        assert slurm_cluster.job_ids() == []
        assert launcher.wait(30) == 130
        procs.wait_until(lambda: nothing_left(home), timeout=WAIT_S, what="every task and grandchild gone")
        check = run(env, shoal("check", job["id"]), timeout=90)
        assert check.returncode == 0, check.stdout
        assert re.search(r"^n\d: no process of the job \(Slurm job \d+ is over: Slurm ended every process of its"
                         r" steps\)$", check.stdout, re.M), check.stdout
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_shoal_kill_of_a_job_whose_allocation_ends_with_its_launcher_finds_every_node_clean(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)  # salloc ... shoal run: the allocation ends when the launcher does
    launcher = start(env, ["salloc", "--nodes=2", "--ntasks=4",
                           *shoal("run", "--name", "long", "--ps", "1", "--workers", "2", "--", *SERVE)])
    try:
        job = wait_running(env, launcher, 3)
        out = run(env, shoal("kill", job["id"]), timeout=120)
        assert out.returncode == 0 and "KILLED" in out.stdout and "could not check" not in out.stdout, out.stdout
        assert re.search(r"^n\d: no process of the job \(Slurm job \d+ is (over|completing): Slurm (ended|is ending)"
                         r" every process of its steps\)$", out.stdout, re.M), out.stdout
        launcher.wait(60)
        procs.wait_until(lambda: not slurm_cluster.job_ids(), timeout=WAIT_S, what="salloc's job gone")
        procs.wait_until(lambda: nothing_left(home), timeout=WAIT_S, what="every task and grandchild gone")
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_shoal_check_probes_the_nodes_of_a_live_allocation_for_the_jobs_processes(slurm_cluster, tmp_path):
    home, job, env, launcher = long_job_in_an_allocation(slurm_cluster, tmp_path)
    try:
        shoal_job = wait_running(env, launcher, 3)["id"]
        running = run(env, shoal("check", shoal_job), timeout=90)
        assert running.returncode == 6, running.stdout  # the tasks are meant to run, but they are there
        found = re.findall(r"^(n\d): (ps:0|worker:\d) pid \d+ still runs: ", running.stdout, re.M)
        assert {task for _, task in found} == {"ps:0", "worker:0", "worker:1"}, running.stdout
        assert {node for node, _ in found} == {"n1", "n2"}, running.stdout
        assert run(env, shoal("kill", shoal_job), timeout=90).returncode == 0
        assert launcher.wait(30) == 130
        clean = run(env, shoal("check", shoal_job), timeout=90)
        assert clean.returncode == 0, clean.stdout
        assert sorted(clean.stdout.splitlines()) == ["n1: no process of the job", "n2: no process of the job"]
        assert slurm_cluster.job_ids() == [job]  # the user's allocation goes on
        # A slurmctld that does not answer is no proof the job is over: the check says it could not look.
        blind = run({**env, "SLURM_CONF": unreachable_conf(slurm_cluster, tmp_path)}, shoal("check", shoal_job),
                    timeout=120)
        assert blind.returncode == 6, blind.stdout
        assert re.search(r"^could not check n\d: .*squeue", blind.stdout, re.M), blind.stdout
        assert "no process of the job" not in blind.stdout
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_no_step_survives_the_launchers_sigkill_in_an_allocation(slurm_cluster, tmp_path):
    home, job, env, launcher = long_job_in_an_allocation(slurm_cluster, tmp_path)
    try:
        wait_running(env, launcher, 3)
        assert len(steps(slurm_cluster, job)) == 2  # one agent step per node
        os.kill(launcher.pid, signal.SIGKILL)  # the launcher only: no handler of its runs
        launcher.wait(10)
        procs.wait_until(lambda: not steps(slurm_cluster, job), timeout=WAIT_S, what="no step of the job left")
        procs.wait_until(lambda: nothing_left(home), timeout=WAIT_S, what="every task and grandchild gone")
        assert slurm_cluster.job_ids() == [job]
        assert status(env)[0]["state"] == "KILLED"
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_submitted_job_is_cancelled_when_the_launcher_is_sigkilled(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    launcher = start(env, shoal("run", "--name", "long", "--slurm", "--ps", "1", "--workers", "1", "--", *SERVE))
    try:
        wait_running(env, launcher, 2)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        procs.wait_until(lambda: not slurm_cluster.job_ids(), timeout=WAIT_S, what="squeue empty")
        procs.wait_until(lambda: nothing_left(home), timeout=WAIT_S, what="every task and grandchild gone")
    finally:
        cleanup(home, launcher)


def slow_sbatch(tmp_path: Path) -> str:
    """A directory to put first on PATH, holding an sbatch that submits at once and prints the
    job id 4 s later: a busy slurmctld's answer."""
    bin_dir = tmp_path / "slowbin"
    bin_dir.mkdir()
    real = shutil.which("sbatch")
    assert real, "sbatch is not on PATH"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nout=$({shlex.quote(real)} "$@"); rc=$?\nsleep 4\n'
                                    'echo "$out"; exit $rc\n')
    (bin_dir / "sbatch").chmod(0o755)
    return str(bin_dir)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_no_submitted_job_survives_a_launcher_stopped_before_sbatch_answered(slurm_cluster, tmp_path, sig):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    env["PATH"] = slow_sbatch(tmp_path) + os.pathsep + env["PATH"]
    launcher = start(env, shoal("run", "--name", "race", "--slurm", "--ps", "1", "--workers", "1", "--", *SERVE))
    try:
        procs.wait_until(lambda: slurm_cluster.job_ids(), timeout=WAIT_S, what="the job submitted")
        assert launcher.poll() is None  # sbatch has not answered yet
        os.kill(launcher.pid, sig)
        code = launcher.wait(WAIT_S)
        said = launcher.stdout.read().decode(errors="replace")
        if sig != signal.SIGKILL:
            assert code == 130, said
            assert re.search(r"cancelled Slurm job \d+ before it started", said), said
        procs.wait_until(lambda: not slurm_cluster.job_ids(), timeout=30, what="squeue empty",
                         detail=lambda: f"jobs {slurm_cluster.job_ids()}; the launcher said:\n{said}")
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_status_logs_and_monitor_reach_slurm_tasks_from_another_terminal(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    launcher = start(env, shoal("run", "--name", "long", "--slurm", "--ps", "1", "--workers", "2", "--", *SERVE))
    try:
        job = wait_running(env, launcher, 3)
        table = run(env, shoal("status", job["id"]), timeout=60).stdout
        assert " on n1" in table and " on n2" in table
        logs = run(env, shoal("logs", job["id"], "--task", "ps.0"), timeout=60).stdout
        assert "serving ps:0 pid" in logs
        monitor = run(env, shoal("monitor", job["id"], "--once"), timeout=90)
        assert monitor.returncode == 0, monitor.stdout
        rows = {line.split()[0]: line.split() for line in monitor.stdout.splitlines()[2:]}
        assert set(rows) == {"ps.0", "worker.0", "worker.1"}
        assert {row[2] for row in rows.values()} == {"n1", "n2"}, monitor.stdout  # the HOST column
        for row in rows.values():
            assert row[1] == "RUNNING" and row[4] != "-" and "MiB/" in row[6], monitor.stdout
    finally:
        run(env, shoal("kill", "long"), timeout=90)
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_the_job_secret_is_on_no_command_line(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    job = allocation(slurm_cluster)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    launcher = start(env, shoal("run", "--name", "long", "--ps", "1", "--workers", "1", "--", *SERVE))
    try:
        record = wait_running(env, launcher, 2)
        pid = record["tasks"][0]["pid"]
        secret = psutil.Process(pid).environ()["SHOAL_JOB_SECRET"]
        assert re.fullmatch(r"[0-9a-f]{64}", secret)
        sruns = [p for p in psutil.Process(launcher.pid).children() if p.name() == "srun"]
        assert len(sruns) == 2 and all("shoal.launch.agent" in p.cmdline() for p in sruns)
        for proc in psutil.process_iter(["cmdline"]):
            assert secret not in " ".join(proc.info["cmdline"] or []), proc
    finally:
        run(env, shoal("kill", "long"), timeout=90)
        cleanup(home, launcher)


@pytest.mark.timeout(120)
def test_dry_run_with_slurm_flag_submits_nothing(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    out = run(env, shoal("train", "examples/mnist.yaml", "--slurm", "--dry-run"), timeout=60)
    assert out.returncode == 0, out.stdout
    assert "# submitted with: sbatch --parsable --job-name=shoal-mnist-TAG --ntasks=4 --cpus-per-task=1" in out.stdout
    assert "warning" not in out.stdout  # the job it submits is sized for the tasks
    assert slurm_cluster.job_ids() == [] and not (home / "jobs.db").exists()


@pytest.mark.timeout(120)
def test_dry_run_inside_an_allocation_places_tasks_on_its_nodes_and_starts_no_step(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    job = allocation(slurm_cluster)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    out = run(env, shoal("train", "examples/mnist.yaml", "--dry-run"), timeout=60)
    assert out.returncode == 0, out.stdout
    assert "# on n1: ps.0, worker.0" in out.stdout and "# on n2: ps.1, worker.1" in out.stdout
    assert "warning" not in out.stdout  # 2 tasks on each node, which holds 2 CPUs of the job
    assert steps(slurm_cluster, job) == []


@pytest.mark.timeout(120)
def test_an_allocation_smaller_than_the_spec_is_warned_about(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    job = allocation(slurm_cluster, nodes=1, tasks=1)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    out = run(env, shoal("train", "examples/mnist.yaml", "--dry-run"), timeout=60)
    assert out.returncode == 0, out.stdout
    assert re.search(rf"^# warning: Slurm job {job} holds 1 CPU on n\d, where ps.0, ps.1, worker.0, worker.1 ask for"
                     r" 4 \(1 for a task without cpus:\); they share them", out.stdout, re.M), out.stdout


@pytest.mark.timeout(120)
def test_slurm_watchdog_cancels_what_is_registered_when_its_pipe_closes(slurm_cluster):
    from shoal.launch.slurm_reaper import SlurmReaper

    kept, cancelled = (slurm_cluster.run(["sbatch", "--parsable", "--ntasks=1", "--output=/dev/null",
                                          "--wrap=exec sleep 120"]).stdout.strip() for _ in range(2))
    reaper = SlurmReaper(slurm_cluster.env)
    reaper.start()
    for job in (kept, cancelled):
        reaper.add(job)
    reaper.remove(kept)
    reaper.close()  # as when the launcher dies: EOF on the watchdog's stdin
    procs.wait_until(lambda: slurm_cluster.job_ids() == [kept], timeout=WAIT_S, what=f"only job {kept} left")


LAUNCHER_WITH_A_REAPER = """
import sys
from shoal.launch.slurm_reaper import SlurmReaper
reaper = SlurmReaper({{"SLURM_CONF": {conf!r}, "PATH": {path!r}}})
reaper.start()
for job in sys.argv[1:]:
    reaper.add(job)
print("registered", flush=True)
sys.stdin.read()
"""


@pytest.mark.timeout(240)
def test_slurm_watchdog_cancels_jobs_once_slurmctld_is_back_after_the_launchers_sigkill(slurm_cluster):
    jobs = [slurm_cluster.run(["sbatch", "--parsable", "--ntasks=1", "--output=/dev/null",
                               "--wrap=exec sleep 300"]).stdout.strip() for _ in range(3)]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER_WITH_A_REAPER.format(
        conf=str(slurm_cluster.conf), path=os.environ["PATH"]), *jobs], cwd=REPO, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    watchdog = None
    try:
        assert launcher.stdout.readline() == "registered\n"
        [watchdog] = psutil.Process(launcher.pid).children()
        with slurm_cluster.controller_down():
            launcher.kill()  # the watchdog's scancel fails: slurmctld is down
            launcher.wait(10)
            time.sleep(15)  # scancel gives up on a slurmctld it cannot reach after ~9 s (exit 8)
        procs.wait_until(lambda: slurm_cluster.job_ids() == [], timeout=WAIT_S + 30,
                         what=f"jobs {', '.join(jobs)} cancelled once slurmctld answers", interval=0.5)
        procs.wait_until(lambda: not watchdog.is_running(), timeout=WAIT_S, what="the watchdog's exit")
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(10)
        if watchdog is not None and watchdog.is_running():  # (in its own session: it would retry for 30 min)
            watchdog.kill()


@pytest.mark.timeout(120)
def test_slurm_watchdog_cancels_a_job_by_its_registered_name_when_its_pipe_closes(slurm_cluster):
    from shoal.launch.slurm import submit_name
    from shoal.launch.slurm_reaper import SlurmReaper

    kept, cancelled = submit_name("kept", "0123abcd"), submit_name("named", "4567cdef")
    for name in (kept, cancelled):
        slurm_cluster.run(["sbatch", "--parsable", "--ntasks=1", "--output=/dev/null", f"--job-name={name}",
                           "--wrap=exec sleep 120"])
    [kept_id] = slurm_cluster.run(["squeue", "-h", f"--name={kept}", "-o", "%i"]).stdout.split()
    reaper = SlurmReaper(slurm_cluster.env)
    reaper.start()
    for name in (kept, cancelled):
        reaper.add_name(name)
    reaper.remove_name(kept)
    reaper.close()  # as when the launcher dies before sbatch said the id: EOF on the watchdog's stdin
    procs.wait_until(lambda: slurm_cluster.job_ids() == [kept_id], timeout=WAIT_S, what=f"only job {kept_id} left")


@pytest.mark.timeout(120)
def test_role_hosts_pin_tasks_to_named_nodes_of_the_allocation(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    job = allocation(slurm_cluster)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    (tmp_path / "job.yaml").write_text("name: pinned\nrun: python t.py\nroles:\n  ps: {count: 2, hosts: [n2]}\n"
                                       "  worker: {count: 2}\n")
    out = run(env, shoal("train", str(tmp_path / "job.yaml"), "--dry-run"), timeout=60)
    assert out.returncode == 0, out.stdout
    assert "# on n1: worker.0, worker.1" in out.stdout and "# on n2: ps.0, ps.1" in out.stdout


@pytest.mark.timeout(180)
def test_role_hosts_pin_tasks_to_named_nodes_of_the_job_slurm_flag_submits(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    (tmp_path / "job.yaml").write_text("name: pinned\nrun: python tests/launch_programs/serve.py --lifetime 2\n"
                                       "roles:\n  ps: {count: 1, hosts: [n2]}\n  worker: {count: 1}\n")
    dry = run(env, shoal("train", str(tmp_path / "job.yaml"), "--slurm", "--dry-run"), timeout=60)
    assert dry.returncode == 0 and "--nodelist=n2 " in dry.stdout and "# on n2: ps.0" in dry.stdout, dry.stdout
    try:
        out = run(env, shoal("train", str(tmp_path / "job.yaml"), "--slurm"), timeout=150)
        assert out.returncode == 0, out.stdout
        assert re.search(r"pinned\.ps\.0: STARTING -> RUNNING \(pid \d+ on n2\)", out.stdout), out.stdout
    finally:
        cleanup(home)


@pytest.mark.timeout(180)
def test_task_output_comes_through_srun_byte_for_byte(slurm_cluster, tmp_path):
    """Long lines, a last line without a newline and bytes that are not UTF-8 travel through the
    agent's JSON lines and srun's I/O forwarding, and the log file gets what the task wrote."""
    home = tmp_path / "home"
    job = allocation(slurm_cluster)
    env = shoal_env(slurm_cluster, home, SLURM_JOB_ID=job)
    program = ("import sys; out = sys.stdout.buffer; out.write(b'x' * 300000 + b'\\n'); "
               "out.write(bytes(range(256)) + b'\\n'); out.write(b'no newline at the end'); out.flush()")
    out = run(env, shoal("run", "--name", "bytes", "--workers", "1", "--", "python", "-c", program))
    assert out.returncode == 0, out.stdout[-2000:]
    log = Path(status(env)[0]["tasks"][0]["log_path"]).read_bytes()
    # as for a local task, the launcher completes a last line that has no newline
    assert log == b"x" * 300000 + b"\n" + bytes(range(256)) + b"\n" + b"no newline at the end\n"


@pytest.mark.timeout(180)
def test_a_submitted_job_that_can_never_start_is_cancelled_at_once_and_says_why(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    spec = tmp_path / "big.yaml"  # 4 CPUs per task: more than a node of the test cluster has (2)
    spec.write_text("name: big\nrun: python examples/mnist_softmax.py --steps 10\n"
                    "roles:\n  ps: {count: 1}\n  worker: {count: 2, cpus: 4}\n")
    out = run(env, shoal("train", str(spec), "--slurm"), timeout=120)
    assert out.returncode == 6, out.stdout
    job = re.search(r"submitted Slurm job (\d+)", out.stdout).group(1)
    assert re.search(rf"Slurm job {job} can never start: it is PENDING for PartitionConfig: it asks for more than"
                     r" the partition's nodes have .*; it is cancelled", out.stdout), out.stdout
    assert f"shoal | cancelled Slurm job {job} before it started" in out.stdout
    assert slurm_cluster.job_ids() == []


@pytest.mark.timeout(300)
def test_a_submitted_job_waiting_in_the_queue_is_in_status_and_shoal_kill_cancels_it(slurm_cluster, tmp_path):
    """Every CPU of the test cluster is held by a user's allocation, so the job `--slurm`
    submits waits in the queue (PENDING, Resources): it is recorded as it waits, and `shoal
    kill` from another terminal stops its launcher and leaves squeue with the user's job only."""
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    held = allocation(slurm_cluster, nodes=len(NODES), tasks=len(NODES) * CPUS_PER_NODE)  # every CPU
    launcher = start(env, shoal("run", "--name", "queued", "--slurm", "--ps", "1", "--workers", "1", "--", *SERVE))
    try:
        def queued():
            jobs = status(env)
            return jobs[0] if jobs and "PENDING (Resources)" in jobs[0]["reason"] else None
        procs.wait_until(queued, timeout=WAIT_S, what="the queued job recorded PENDING (Resources)", interval=0.3)
        job = queued()
        assert job["state"] == "PENDING" and job["tasks"] == [] and job["number"] == 1, job
        submitted = re.search(r"Slurm job (\d+) is PENDING", job["reason"]).group(1)
        assert sorted(slurm_cluster.job_ids()) == sorted([held, submitted])
        table = run(env, shoal("status"), timeout=60).stdout
        assert re.search(r"1\s+queued-\S+\s+queued\s+PENDING\s+queued\s", table), table
        logs = run(env, shoal("logs", "1"), timeout=60)
        assert logs.returncode == 0 and "waits in the queue (Slurm job" in logs.stdout, logs.stdout
        monitor = run(env, shoal("monitor", "1", "--once"), timeout=60)
        assert f"no task has started (Slurm job {submitted} is PENDING (Resources))" in monitor.stdout, monitor.stdout
        watching = subprocess.Popen(shoal("monitor", "1", "--interval", "0.5"), cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            shown, _ = watching.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(watching.pid, signal.SIGKILL)
            shown, _ = watching.communicate(timeout=30)
        assert 1 <= shown.count("no task has started") <= 10, shown[-500:]  # one per interval, not a busy loop
        out = run(env, shoal("kill"), timeout=120)
        assert out.returncode == 0, out.stdout
        assert f"job {job['id']}: KILLED (stopped by shoal kill before it started)" in out.stdout, out.stdout
        assert launcher.wait(30) == 130  # it cancelled the Slurm job itself, as after Ctrl-C
        said = launcher.stdout.read().decode()
        assert f"shoal | cancelled Slurm job {submitted} before it started" in said, said
        assert slurm_cluster.job_ids() == [held]
    finally:
        cleanup(home, launcher)
        slurm_cluster.run(["scancel", held], check=False)


@pytest.mark.timeout(180)
def test_a_heterogeneous_allocation_is_refused_before_any_step_starts(slurm_cluster, tmp_path):
    home = tmp_path / "home"
    env = shoal_env(slurm_cluster, home)
    try:
        out = run(env, ["salloc", "-N1", "-n2", ":", "-N1", "-n2",
                        *shoal("train", "examples/mnist.yaml", "-p", "steps=50")], timeout=150)
        assert out.returncode == 6, out.stdout
        assert re.search(r"Slurm job (\d+) is a heterogeneous job \(components \1-\d+\), which shoal does not run in:"
                         r" .*allocate one component instead", out.stdout), out.stdout
        assert "STARTING" not in out.stdout and status(env) == []
        procs.wait_until(lambda: not slurm_cluster.job_ids(), timeout=WAIT_S, what="salloc's job gone")
    finally:
        cleanup(home)


@pytest.mark.timeout(300)
def test_status_lists_every_job_when_slurm_cannot_answer_for_one_whose_launcher_died(slurm_cluster, tmp_path):
    """A Slurm job's launcher is SIGKILLed and slurmctld cannot be reached: `shoal status` still
    lists every job, the dead launcher's one as recorded with a line saying why it was not
    checked, and exits 0; once Slurm answers, status reconciles it (KILLED)."""
    home, job, env, launcher = long_job_in_an_allocation(slurm_cluster, tmp_path)
    try:
        dead = wait_running(env, launcher, 3)
        quick = run(env | {"SLURM_JOB_ID": ""}, shoal("run", "--name", "quick", "--", "python", "-c", "pass"))
        assert quick.returncode == 0, quick.stdout
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
        blind = {**env, "SLURM_CONF": unreachable_conf(slurm_cluster, tmp_path)}
        listing = run(blind, shoal("status"), timeout=120)
        assert listing.returncode == 0, listing.stdout
        assert re.search(r"^2\s+quick-\S+\s+quick\s+SUCCEEDED\s", listing.stdout, re.M), listing.stdout
        assert re.search(rf"^1\s+{dead['id']}\s+long\s+RUNNING\s", listing.stdout, re.M), listing.stdout
        assert re.search(rf"^job {dead['id']} is shown as recorded: its launcher is gone, but Slurm could not say"
                         rf" whether {job}\.\d+ still runs \(squeue .*\); check by hand: squeue -s -j {job}",
                         listing.stdout, re.M), listing.stdout
        as_json = run(blind, shoal("status", "--json"), timeout=120)
        assert as_json.returncode == 0, as_json.stdout
        shown = {j["name"]: j for j in json.loads(as_json.stdout)}
        assert shown["long"]["state"] == "RUNNING" and "squeue" in shown["long"]["unchecked"], shown["long"]
        assert "unchecked" not in shown["quick"]
        procs.wait_until(lambda: not steps(slurm_cluster, job), timeout=WAIT_S, what="the watchdog's scancel")
        assert [(j["name"], j["state"], "unchecked" in j) for j in status(env)] == \
            [("quick", "SUCCEEDED", False), ("long", "KILLED", False)]
    finally:
        cleanup(home, launcher)


@pytest.mark.timeout(300)
def test_shoal_kill_says_the_job_is_killed_then_that_slurm_could_not_verify_it(slurm_cluster, tmp_path):
    """`shoal kill` whose own Slurm commands cannot reach slurmctld: the launcher stops the job,
    and the kill says so first, then, in one line, that the check could not run and what to do
    by hand; exit 6 (the kill worked, the verification did not)."""
    home, job, env, launcher = long_job_in_an_allocation(slurm_cluster, tmp_path)
    try:
        shoal_job = wait_running(env, launcher, 3)["id"]
        blind = {**env, "SLURM_CONF": unreachable_conf(slurm_cluster, tmp_path)}
        out = run(blind, shoal("kill", shoal_job), timeout=180)
        assert out.returncode == 6, out.stdout
        lines = out.stdout.splitlines()
        assert lines[0] == f"job {shoal_job}: KILLED (stopped by shoal kill)", out.stdout
        assert len(lines) == 2 and re.fullmatch(
            rf"shoal kill: error: job {shoal_job} is stopped, but it could not be checked that nothing of it is"
            rf" left: Slurm could not say whether {job}\.\d+ still runs \(squeue .*\); check by hand: squeue -s -j"
            rf" {job}, and scancel {job}\.\d+ if it is still listed; shoal check --kill {shoal_job} checks again",
            lines[1]), out.stdout
        assert launcher.wait(30) == 130
        procs.wait_until(lambda: not steps(slurm_cluster, job), timeout=WAIT_S, what="no step of the job left")
        procs.wait_until(lambda: nothing_left(home), timeout=WAIT_S, what="every task and grandchild gone")
    finally:
        cleanup(home, launcher)
