"""The SSH executor end to end: `shoal` as a real process on this machine, its tasks on three
network-namespace hosts reached through their own sshd (`--ssh-config` with the run's
ssh_config), the seed job and its failures. Every wait is bounded; launchers are killed by
process group; the hosts' reset kills whatever a test left there."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.multihost import procs

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
UNTIL_FILE = str(Path(__file__).parent / "programs" / "until_file.py")
HOSTS = "host1,host2,host3"


class Shoal:
    """`shoal` for one test: its own SHOAL_HOME, the run's ssh_config, the launchers it started."""

    def __init__(self, home: Path, ssh_config: Path):
        self.home = home
        self.ssh_config = str(ssh_config)
        self.launchers: list[subprocess.Popen] = []

    def env(self) -> dict:
        env = dict(os.environ, SHOAL_HOME=str(self.home), PYTHONUNBUFFERED="1")
        env.pop("TF_CONFIG", None)
        return env

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """`shoal ARGS` to its end; stdout and stderr together, as text."""
        return subprocess.run([PY, "-m", "shoal.cli.main", *args], cwd=REPO, env=self.env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen:
        """`shoal ARGS` in its own session, output to a file (read it with `output`)."""
        log = open(self.home.parent / f"launcher-{len(self.launchers)}.out", "wb")
        proc = subprocess.Popen([PY, "-m", "shoal.cli.main", *args], cwd=REPO, env=self.env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        proc.log = log.name  # type: ignore[attr-defined]
        self.launchers.append(proc)
        return proc

    @staticmethod
    def output(proc: subprocess.Popen) -> str:
        return Path(proc.log).read_text(errors="replace")  # type: ignore[attr-defined]

    def jobs(self) -> list[dict]:
        out = self.run("status", "--json", timeout=60)
        assert out.returncode == 0, out.stdout
        return json.loads(out.stdout)

    def job(self) -> dict:
        [job] = self.jobs()
        return job

    def close(self) -> None:
        for proc in self.launchers:
            procs.stop(proc, grace=5)


@pytest.fixture
def shoal(tmp_path, host_network):
    s = Shoal(tmp_path / "home", host_network.ssh_config)
    yield s
    s.close()


def job_processes(hosts, job_id: str) -> dict[str, list[int]]:
    """Per host, the processes whose environment holds the job's id (all of a task's tree)."""
    out = {}
    for host in hosts:
        found = []
        for pid in host.pids(include_sshd=False):
            try:
                if psutil.Process(pid).environ().get("SHOAL_JOB_ID") == job_id:
                    found.append(pid)
            except psutil.Error:
                continue
        out[host.name] = found
    return out


def agents(hosts) -> dict[str, list[int]]:
    """Per host, the host agents running there."""
    out = {}
    for host in hosts:
        found = []
        for pid in host.pids(include_sshd=False):
            try:
                if "shoal.launch.agent" in psutil.Process(pid).cmdline():
                    found.append(pid)
            except psutil.Error:
                continue
        out[host.name] = found
    return out


def wait_nothing_left(hosts, timeout: float = 15) -> None:
    """Every host back to its sshd alone (ssh sessions end a moment after their command)."""
    procs.wait_until(lambda: all(h.pids() == [h.sshd_pid] for h in hosts), timeout=timeout,
                     what="no process but sshd on any host",
                     detail=lambda: "\n".join(f"{h.name}: {_describe(h.pids(include_sshd=False))}" for h in hosts))


def _describe(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            out.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:120]}")
        except psutil.Error:
            pass
    return "; ".join(out) or "none"


def wait_running(shoal: Shoal, count: int, timeout: float = 60) -> dict:
    """The job once `count` of its tasks run and a step was recorded."""
    def ready():
        jobs = shoal.jobs()
        if not jobs:
            return None
        job = jobs[0]
        running = [t for t in job["tasks"] if t["state"] == "RUNNING"]
        return job if len(running) == count and job["step"] else None
    job = None
    deadline = time.monotonic() + timeout
    while job is None:
        assert time.monotonic() < deadline, f"the job did not run {count} tasks within {timeout}s"
        for launcher in shoal.launchers:
            assert launcher.poll() is None, shoal.output(launcher)
        job = ready()
        if job is None:
            time.sleep(0.2)
    return job


def accuracies(text: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^\S+\.(worker\.\d) \| accuracy: (\d\.\d+)$",
                                                                text, re.M)}


SEED = {
    "1ps-run-hostfile": ["run", "--name", "seed", "--ps", "1", "--workers", "2", "--hostfile", "HOSTFILE", "--",
                         "python", "examples/mnist_softmax.py", "--steps", "1000"],
    "2ps-train-hosts": ["train", "examples/mnist.yaml", "--hosts", HOSTS],
}


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("shape", list(SEED))
def test_seed_job_over_three_hosts_reaches_90_percent_and_leaves_nothing(shoal, hosts, tmp_path, shape, mode):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the seed's three machines\nhost1 slots=1\nhost2 slots=1\nhost3 slots=1\n")
    command, *args = [str(hostfile) if a == "HOSTFILE" else a for a in SEED[shape]]
    if mode == "sync":
        args += ["--sync"] if shape.startswith("1ps") else ["-p", "sync=--sync"]
    elif shape.startswith("2ps"):
        # worker.1 shares host1 with ps.0, which holds the whole softmax: it pushes about twice as
        # fast as worker.0 across the link, whose async gradients are then staler. At the seed's
        # learning rate of 0.5 the model's accuracy then swings by 2% from one step to the next:
        # a worker evaluated 0.8952 (the other 0.9154 a step later) in 1 of 14 runs here with the
        # cores loaded, and CI saw 0.8956 at 1000 steps and 0.893 at 1500. At 0.3 it stays within
        # 0.90-0.92 (and a replay of such staleness in one process: 0.911 at the lowest)
        args += ["-p", "steps=1500", "-p", "learning_rate=0.3"]
    out = shoal.run(command, "--ssh-config", shoal.ssh_config, *args, timeout=150)
    assert out.returncode == 0, out.stdout
    job = shoal.job()
    assert job["state"] == "SUCCEEDED"
    where = {t["name"]: t["detail"] for t in job["tasks"]}
    assert set(where.values()) == {"exit 0"}, where  # the ps too: they end by themselves (even if stopped as they do)
    hosts_of = {t["name"]: t["address"].rsplit(":", 1)[0] for t in job["tasks"]}
    pids = {t["name"]: t["pid"] for t in job["tasks"]}
    address = {h.name: h.address for h in hosts}
    if shape.startswith("1ps"):
        assert hosts_of == {"ps.0": address["host1"], "worker.0": address["host2"], "worker.1": address["host3"]}
    else:
        assert hosts_of == {"ps.0": address["host1"], "ps.1": address["host2"], "worker.0": address["host3"],
                            "worker.1": address["host1"]}
    found = accuracies(out.stdout)
    assert set(found) == {"worker.0", "worker.1"} and min(found.values()) >= 0.90, found
    # A worker next to its ps pushes through shared memory (with 2 ps, worker.1 shares host1 with
    # ps.0, which holds the softmax's W); across hosts everything stays on the socket.
    attached = re.findall(r"^\S+\.(ps\.\d) \| .*: a client on this machine \(pid (\d+)\) sends its tensors "
                          r"through shared memory$", out.stdout, re.M)
    shared = re.findall(r"^\S+\.(ps\.\d) \| .*: (\d+) requests came through shared memory, (\d+) on the doorbell \(",
                        out.stdout, re.M)
    if shape.startswith("2ps"):
        assert [name for name, _ in attached] == ["ps.0"], attached
        assert int(attached[0][1]) == pids["worker.1"], (attached, pids)
        assert [name for name, n, _ in shared if int(n) > 0] == ["ps.0"], shared
        assert [name for name, _, n in shared if int(n) > 0] == ["ps.0"], "its headers skip zmq on the host too"
    else:
        assert attached == [] and shared == [], (attached, shared)
    assert f"checked host1, host2, host3: no process of job {job['id']} is left" in out.stdout
    logs = Path(job["job_dir"]) / "logs"
    assert "accuracy: 0.9" in (logs / "worker.1.log").read_text()  # a remote task's log, on the launcher
    wait_nothing_left(hosts)


@pytest.mark.parametrize("flag, mechanism", [([], "CURVE"), (["--wire_security", "plain"], "PLAIN")],
                         ids=["default", "plain"])
def test_seed_job_between_hosts_uses_curve_unless_its_flag_asks_for_plain(shoal, hosts, flag, mechanism):
    out = shoal.run("run", "--name", "seed", "--ps", "1", "--workers", "2", "--hosts", HOSTS, "--ssh-config",
                    shoal.ssh_config, "--", "python", "examples/mnist_softmax.py", "--steps", "300", *flag,
                    timeout=150)
    assert out.returncode == 0, out.stdout
    assert re.search(rf"^seed\.ps\.0 \| .* serving at {re.escape(hosts[0].address)}:\d+ \({mechanism};", out.stdout,
                     re.M), out.stdout
    warned = "security PLAIN between hosts: traffic is not encrypted" in out.stdout
    assert warned is (mechanism == "PLAIN"), out.stdout
    assert set(accuracies(out.stdout)) == {"worker.0", "worker.1"}
    wait_nothing_left(hosts)


def test_dry_run_prints_per_host_what_runs_there_and_starts_nothing(shoal, hosts):
    out = shoal.run("train", "examples/mnist.yaml", "--hosts", HOSTS, "--ssh-config", shoal.ssh_config,
                    "--dry-run", timeout=60)
    assert out.returncode == 0, out.stdout
    text = out.stdout
    assert text.index("## on host1: ps.0, worker.1") < text.index("## on host2: ps.1") \
        < text.index("## on host3: worker.0")
    assert f"# mnist.ps.1  {hosts[1].address}:" in text and f"# mnist.worker.0  {hosts[2].address}:" in text
    assert "SHOAL_JOB_SECRET='<hidden: fresh per job>'" in text
    assert not (shoal.home / "jobs.db").exists()
    wait_nothing_left(hosts)


def test_the_job_secret_is_in_no_argv_on_any_host(shoal, hosts):
    launcher = shoal.start("run", "--name", "secret", "--ps", "1", "--workers", "2", "--hosts", HOSTS,
                           "--ssh-config", shoal.ssh_config, "--", "python", "examples/mnist_softmax.py",
                           "--steps", "1000000")
    job = wait_running(shoal, 3)
    task_pids = [pid for pids in job_processes(hosts, job["id"]).values() for pid in pids]
    assert len(task_pids) >= 3
    secret = psutil.Process(task_pids[0]).environ()["SHOAL_JOB_SECRET"]
    assert len(secret) == 64
    # Every process of this machine: the launcher, its ssh clients, the hosts' sshd sessions, the
    # agents, the tasks (the hosts share this machine's PID namespace).
    for proc in psutil.process_iter(["cmdline"]):
        assert secret not in " ".join(proc.info["cmdline"] or ()), proc
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(60) == 130
    wait_nothing_left(hosts)


def test_sigkill_of_the_launcher_leaves_no_process_of_the_job_on_any_host_within_10s(shoal, hosts):
    launcher = shoal.start("run", "--name", "orphan", "--ps", "1", "--workers", "2", "--hosts", HOSTS,
                           "--ssh-config", shoal.ssh_config, "--", "python", "examples/mnist_softmax.py",
                           "--steps", "1000000")
    job = wait_running(shoal, 3)
    assert all(job_processes(hosts, job["id"]).values())
    os.kill(launcher.pid, signal.SIGKILL)
    procs.wait_until(lambda: not any(job_processes(hosts, job["id"]).values()) and not any(agents(hosts).values()),
                     timeout=10, what="no process of the job and no agent on any host",
                     detail=lambda: str(job_processes(hosts, job["id"])))
    status = shoal.run("status", job["id"], timeout=60)
    assert "KILLED" in status.stdout
    assert "the launcher died; its tasks were stopped (by their hosts' agents)" in status.stdout
    check = shoal.run("check", job["id"], timeout=60)
    assert check.returncode == 0, check.stdout
    assert check.stdout.splitlines() == [f"{h}: no process of the job" for h in ("host1", "host2", "host3")]
    wait_nothing_left(hosts)


def test_shoal_kill_from_another_terminal_and_status_logs_monitor_show_remote_tasks(shoal, hosts):
    launcher = shoal.start("run", "--name", "watched", "--ps", "1", "--workers", "2", "--hosts", HOSTS,
                           "--ssh-config", shoal.ssh_config, "--", "python", "examples/mnist_softmax.py",
                           "--steps", "1000000")
    job = wait_running(shoal, 3)
    status = shoal.run("status", "watched", timeout=60).stdout
    for task, host in (("ps.0", hosts[0]), ("worker.0", hosts[1]), ("worker.1", hosts[2])):
        line = next(line for line in status.splitlines() if line.startswith(f"watched.{task} "))
        assert "RUNNING" in line and f"{host.address}:" in line and line.endswith(f"on {host.name}"), line
    monitor = shoal.run("monitor", "watched", "--once", timeout=60)
    assert monitor.returncode == 0, monitor.stdout
    rows = {line.split()[0]: line.split() for line in monitor.stdout.splitlines()[2:]}
    assert set(rows) == {"ps.0", "worker.0", "worker.1"}
    assert monitor.stdout.splitlines()[1].split()[:4] == ["TASK", "STATE", "HOST", "PID"]
    assert {task: row[2] for task, row in rows.items()} == {"ps.0": "host1", "worker.0": "host2", "worker.1": "host3"}
    for row in rows.values():
        assert row[1] == "RUNNING" and float(row[4]) >= 0 and row[6].endswith("iB"), row  # CPU%, memory measured
    logs = shoal.run("logs", "watched", "--task", "worker.1", timeout=60).stdout
    assert "worker:1 starts at global step" in logs
    killed = shoal.run("kill", "watched", timeout=90)
    assert killed.returncode == 0, killed.stdout
    assert killed.stdout.splitlines()[0].startswith(f"job {job['id']}: KILLED")
    assert killed.stdout.splitlines()[1:] == [f"{h}: no process of the job" for h in ("host1", "host2", "host3")]
    assert launcher.wait(30) == 130
    assert not any(job_processes(hosts, job["id"]).values())
    wait_nothing_left(hosts)


def test_a_down_host_and_a_refused_key_are_named_before_any_task_starts(shoal, hosts, host_network, tmp_path):
    wrong_key = tmp_path / "not_authorized"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True, timeout=30)
    config = host_network.ssh_config.read_text()
    block = config.index("Host host2")
    config = config[:block] + config[block:].replace(str(host_network.identity), str(wrong_key), 1)
    (tmp_path / "ssh_config").write_text(config)
    (tmp_path / "job.yaml").write_text(
        "name: blocked\nrun: python examples/mnist_softmax.py --steps 100\n"
        "roles: {ps: {count: 1}, worker: {count: 2}}\nssh: {connect_timeout: 2s}\n")
    hosts[2].link_down()
    out = shoal.run("train", str(tmp_path / "job.yaml"), "--hosts", HOSTS, "--ssh-config",
                    str(tmp_path / "ssh_config"), timeout=60)
    assert out.returncode == 4, out.stdout
    lines = out.stdout.splitlines()
    assert lines[0] == "shoal train: error: 2 of 3 hosts cannot run the job (nothing was started):"
    assert lines[1].startswith("  host2: ssh refused the login (") and "Permission denied" in lines[1]
    assert lines[2].startswith("  host3: unreachable (") and "host3" not in lines[1]
    assert len(lines) == 3
    assert not (shoal.home / "jobs.db").exists()  # no job was recorded, none started
    hosts[2].link_up()
    wait_nothing_left(hosts[:2])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_launcher_stopped_while_it_waits_for_a_host_says_so_and_leaves_nothing(shoal, hosts, tmp_path, sig):
    (tmp_path / "job.yaml").write_text(
        "name: early\nrun: python examples/mnist_softmax.py --steps 100\n"
        "roles: {ps: {count: 1}, worker: {count: 2}}\nssh: {connect_timeout: 20s}\n")
    hosts[2].link_down()  # the agents of host1 and host2 start; host3's connection hangs
    try:
        launcher = shoal.start("train", str(tmp_path / "job.yaml"), "--hosts", HOSTS, "--ssh-config",
                               shoal.ssh_config)
        procs.wait_until(lambda: len([a for pids in agents(hosts[:2]).values() for a in pids]) == 2, timeout=30,
                         what="the agents of host1 and host2")
        launcher.send_signal(sig)
        assert launcher.wait(30) == 130, shoal.output(launcher)
        name = signal.Signals(sig).name
        assert f"shoal train: stopped by {name} while the job was being set up; it was not started" \
            in shoal.output(launcher), shoal.output(launcher)
    finally:
        hosts[2].link_up()
    wait_nothing_left(hosts)


def test_a_changed_host_key_is_named_with_how_to_remove_the_old_one(shoal, hosts, host_network, tmp_path):
    """host1 answers with another key than the one known_hosts holds for it (reinstalled, or not
    host1 at all): refused before anything starts, saying it changed and how to remove the old key."""
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    known = tmp_path / "known_hosts"
    known.write_text(f"{hosts[0].address} {other.with_suffix('.pub').read_text().split(' ')[0]} "
                     f"{other.with_suffix('.pub').read_text().split(' ')[1]}\n")
    config = host_network.ssh_config.read_text()
    block = config.index("Host host1")
    end = config.index("Host host2")
    config = config[:block] + config[block:end].replace(str(host_network.known_hosts), str(known), 1) + config[end:]
    (tmp_path / "ssh_config").write_text(config)
    (tmp_path / "job.yaml").write_text("name: rekeyed\nrun: python examples/mnist_softmax.py --steps 100\n"
                                       "roles: {ps: {count: 1}, worker: {count: 2}}\n")
    out = shoal.run("train", str(tmp_path / "job.yaml"), "--hosts", HOSTS, "--ssh-config",
                    str(tmp_path / "ssh_config"), "--dry-run", timeout=60)
    assert out.returncode == 4, out.stdout
    lines = out.stdout.splitlines()
    assert lines[0] == "shoal train: error: 1 of 3 hosts cannot run the job (nothing was started):", out.stdout
    assert lines[1].startswith(f"  host1: its host key has changed since it was last accepted (Host key for"
                               f" {hosts[0].address} has changed"), lines[1]
    quoted = [f"ssh-keygen -f {q}{known}{q} -R {q}{hosts[0].address}{q}" for q in "'\""]  # as this ssh quotes
    assert any(f"remove the old key ({command})" in lines[1] for command in quoted), lines[1]
    assert "WARNING" not in out.stdout and len(lines) == 2
    wait_nothing_left(hosts)


def test_a_missing_interpreter_is_named_per_host_before_any_task_starts(shoal, hosts, tmp_path):
    (tmp_path / "job.yaml").write_text(
        "name: nopy\nrun: python examples/mnist_softmax.py --steps 100\n"
        "roles: {worker: {count: 3}}\nssh: {python: /opt/nowhere/bin/python}\n")
    out = shoal.run("train", str(tmp_path / "job.yaml"), "--hosts", HOSTS, "--ssh-config", shoal.ssh_config,
                    timeout=60)
    assert out.returncode == 4, out.stdout
    lines = out.stdout.splitlines()
    assert lines[1:] == [f"  {h}: no interpreter /opt/nowhere/bin/python there; install that Python there (the"
                         " same path on every host), or set ssh.python in the spec to the interpreter the hosts have"
                         for h in ("host1", "host2", "host3")]
    wait_nothing_left(hosts)


def test_a_worker_host_that_vanishes_is_detected_and_fails_the_job_and_its_agent_cleans_up(shoal, hosts, tmp_path):
    (tmp_path / "job.yaml").write_text(
        "name: vanish\nrun: python examples/mnist_softmax.py --steps 1000000\n"
        "roles: {ps: {count: 1}, worker: {count: 2}}\nssh: {heartbeat_timeout: 3s}\n")
    launcher = shoal.start("train", str(tmp_path / "job.yaml"), "--hosts", HOSTS, "--ssh-config", shoal.ssh_config)
    job = wait_running(shoal, 3)
    hosts[2].link_down()  # worker.1's host: gone without a FIN
    assert launcher.wait(60) == 1
    text = shoal.output(launcher)
    # Shoal's heartbeat (3 s) says why, unless ssh's own keepalive (the backstop, ~6 s) ends the
    # connection first on a loaded machine: the reason is ssh's then
    lost = re.search(r"^vanish\.worker\.1 \| shoal: lost the agent on host3 \((.+)\); the task counts as failed$", text,
                     re.M)
    assert lost, text
    assert "shoal | checking host3 again over a new connection (its agent was lost; up to 8s)" in text, text
    assert f"shoal | host3: not checked, its agent was lost ({lost.group(1)}; a new connection failed too: " in text, text
    assert f"shoal | checked host1, host2: no process of job {job['id']} is left" in text, text
    job = shoal.job()
    assert job["state"] == "FAILED" and job["reason"] == "vanish.worker.1 failed (exit 255)"
    hosts[2].link_up()
    # Cut off from its launcher, host3's agent stopped the task by itself.
    procs.wait_until(lambda: not job_processes(hosts, job["id"])["host3"] and not agents(hosts[2:])["host3"],
                     timeout=20, what="nothing of the job on host3 once it is back")
    check = shoal.run("check", job["id"], timeout=60)
    assert check.returncode == 0, check.stdout
    wait_nothing_left(hosts[:2])


def test_a_worker_whose_host_vanishes_moves_to_another_host_and_the_job_finishes(shoal, hosts, tmp_path):
    (tmp_path / "job.yaml").write_text(
        "name: moves\nrun: python examples/mnist_softmax.py --steps 40000 --heartbeat_timeout 2\n"
        "roles: {ps: {count: 1}, worker: {count: 2}}\n"
        "restart: {policy: on-failure, max_restarts: 2, backoff: 1s}\nssh: {heartbeat_timeout: 3s}\n")
    launcher = shoal.start("train", str(tmp_path / "job.yaml"), "--hosts", HOSTS, "--ssh-config", shoal.ssh_config)
    wait_running(shoal, 3)
    hosts[2].link_down()  # worker.1's host: gone without a FIN, back once its worker moved
    procs.wait_until(lambda: "was lost: worker:1 moves to" in shoal.output(launcher), timeout=60,
                     what="worker:1 moving off host3")
    procs.wait_until(lambda: "worker:1 left (no heartbeat for 2s" in shoal.output(launcher), timeout=30,
                     what="ps.0 dropping worker:1")
    # host3's agent, 3 s without a word from the launcher, stops worker:1's process: only then does the link come
    # back, with what that process had queued (a link back before that meets it alive, and it rejoins until its
    # agent stops it, as any live replica would)
    job_id = shoal.job()["id"]
    procs.wait_until(lambda: not job_processes(hosts[2:], job_id)["host3"], timeout=30,
                     what="host3's agent stopping worker:1's process")
    hosts[2].link_up()
    assert launcher.wait(150) == 0, shoal.output(launcher)[-3000:]
    text = shoal.output(launcher)
    moved = re.search(r"^shoal \| host3 was lost: worker:1 moves to (host[12]) as worker:2 \(restart 1/2\)$", text, re.M)
    assert moved, text[-3000:]
    job = shoal.job()
    assert job["state"] == "SUCCEEDED"
    tasks = {t["name"]: t for t in job["tasks"]}
    assert tasks["worker.1"]["state"] == "MOVED"
    assert tasks["worker.2"]["state"] == "SUCCEEDED"
    assert tasks["worker.2"]["address"].rsplit(":", 1)[0] == {h.name: h.address for h in hosts}[moved.group(1)]
    found = accuracies(text)
    assert found.keys() >= {"worker.0", "worker.2"} and min(found[w] for w in ("worker.0", "worker.2")) >= 0.90, found
    ps_log = (Path(job["job_dir"]) / "logs" / "ps.0.log").read_text()
    assert re.search(r"membership v\d+: .*worker:2 joined", ps_log)
    # the heartbeats worker:1's dead process had queued, delivered when host3's link came up, do not make it a
    # member again: the job would wait for it to finish
    assert "worker:1 rejoined" not in ps_log and "(1 left)" not in ps_log, ps_log[-3000:]
    assert tasks["ps.0"]["state"] == "SUCCEEDED"  # it stopped by itself: no replica was left training
    # host3 came back before the job ended: the last check reaches it too, over a new connection
    assert f"shoal | checked host1, host2, host3: no process of job {job['id']} is left" in text, text[-3000:]
    assert "host3: not checked" not in text
    assert not job_processes(hosts, job["id"])["host3"]
    wait_nothing_left(hosts)


def one_worker_per_host(shoal, tmp_path, name: str, restart: str, ssh: str):
    """A job of two workers that run until a file appears, one on host1 and one on host2 (one
    slot each: a lost worker cannot move), restarted on failure (`restart`: the policy's other
    fields), with `ssh` options; (the file to write, the launcher) once both run."""
    stop = tmp_path / "stop"
    (tmp_path / "job.yaml").write_text(
        f"name: {name}\nrun: python {UNTIL_FILE} {stop}\nroles: {{worker: {{count: 2}}}}\n"
        f"restart: {{policy: on-failure, {restart}}}\nssh: {{{ssh}}}\n")
    (tmp_path / "hostfile").write_text("host1 slots=1\nhost2 slots=1\n")
    launcher = shoal.start("train", str(tmp_path / "job.yaml"), "--hostfile", str(tmp_path / "hostfile"),
                           "--ssh-config", shoal.ssh_config)
    wait_running(shoal, 2)
    return stop, launcher


def finish_once_worker_1_is_back(shoal, launcher, stop) -> dict:
    """Wait for worker.1's restart on host2, then end the job; its restarts by task (it SUCCEEDED)."""
    procs.wait_until(lambda: "shoal | host2: reconnected to restart worker.1" in shoal.output(launcher),
                     timeout=60, what="worker.1 restarted on host2", detail=lambda: shoal.output(launcher)[-2000:])
    wait_running(shoal, 2)
    stop.write_text("")
    assert launcher.wait(60) == 0, shoal.output(launcher)
    job = shoal.job()
    assert job["state"] == "SUCCEEDED"
    return {t["name"]: t["restarts"] for t in job["tasks"]}


def test_a_task_whose_host_vanished_is_restarted_there_when_it_is_back(shoal, hosts, tmp_path):
    """No other host has a free slot (one each), so the worker cannot move: it waits for its own."""
    stop, launcher = one_worker_per_host(shoal, tmp_path, "comeback", "max_restarts: 3, backoff: 2s",
                                         "heartbeat_timeout: 2s")
    hosts[1].link_down()
    procs.wait_until(lambda: "lost the agent on host2" in shoal.output(launcher), timeout=30,
                     what="the launcher noticing host2 is gone")
    assert "comeback.worker.1: host2 was lost and no other host can take it" in shoal.output(launcher)
    hosts[1].link_up()
    restarts = finish_once_worker_1_is_back(shoal, launcher, stop)
    assert restarts == {"worker.0": 0, "worker.1": 1}
    wait_nothing_left(hosts[:1])


def test_a_restart_whose_host_is_still_away_is_tried_again_until_it_answers(shoal, hosts, tmp_path):
    """The host stays away past the first restart: that restart counts, and the next one, after
    its backoff, finds the host back (the job does not fail with restarts left)."""
    stop, launcher = one_worker_per_host(shoal, tmp_path, "patient", "max_restarts: 6, backoff: 1s",
                                         "heartbeat_timeout: 2s, connect_timeout: 2s")
    hosts[1].link_down()
    procs.wait_until(lambda: re.search(r"patient\.worker\.1 cannot be restarted on host2: host2: unreachable .*;"
                                       r" restart 2/6 in 2s", shoal.output(launcher)),
                     timeout=60, what="a restart that found host2 still away",
                     detail=lambda: shoal.output(launcher)[-2000:])
    assert launcher.poll() is None, shoal.output(launcher)
    hosts[1].link_up()
    assert finish_once_worker_1_is_back(shoal, launcher, stop)["worker.1"] >= 2
    wait_nothing_left(hosts[:2])


def test_the_job_goes_on_while_a_restart_waits_for_its_host(shoal, hosts, tmp_path):
    """A restart on a lost host reconnects in the background: while ssh waits out its connect
    timeout (30 s here), the launcher still serves the job, so Ctrl-C stops it at once."""
    stop, launcher = one_worker_per_host(shoal, tmp_path, "waiting", "max_restarts: 3, backoff: 1s",
                                         "heartbeat_timeout: 2s, connect_timeout: 30s")
    hosts[1].link_down()
    procs.wait_until(lambda: "shoal | host2: connecting again to restart worker.1" in shoal.output(launcher),
                     timeout=60, what="worker.1's restart reconnecting to host2",
                     detail=lambda: shoal.output(launcher)[-2000:])
    time.sleep(1)  # the reconnect is under way: ssh waits for host2 to answer
    launcher.send_signal(signal.SIGINT)
    procs.wait_until(lambda: re.search(r"^shoal \| waiting: .*; stopping worker\.0$", shoal.output(launcher), re.M),
                     timeout=5, what="the job stopping at once, not after the reconnect's 30 s",
                     detail=lambda: shoal.output(launcher)[-2000:])
    assert launcher.wait(60) == 130, shoal.output(launcher)
    tasks = {t["name"]: t["state"] for t in shoal.job()["tasks"]}
    assert tasks == {"worker.0": "KILLED", "worker.1": "KILLED"}, tasks
    hosts[1].link_up()
    wait_nothing_left(hosts[:2])


def test_a_task_left_running_by_a_silent_agent_is_killed_before_its_restart(shoal, hosts, tmp_path):
    """An agent that stops answering (SIGSTOP: alive, connected, silent) is given up, but its task
    runs on: the restart first kills that copy, so that no two copies of a task run at once (a
    ps's port, the chief's model dir)."""
    stop, launcher = one_worker_per_host(shoal, tmp_path, "silent", "max_restarts: 2, backoff: 1s",
                                         "heartbeat_timeout: 2s")
    job = shoal.job()
    [old_task] = [t["pid"] for t in job["tasks"] if t["name"] == "worker.1"]
    [agent] = agents(hosts[1:2])["host2"]
    os.kill(agent, signal.SIGSTOP)
    try:
        procs.wait_until(lambda: "shoal | host2: reconnected to restart worker.1" in shoal.output(launcher),
                         timeout=60, what="worker.1 restarted on host2", detail=lambda: shoal.output(launcher)[-2000:])
        text = shoal.output(launcher)
        assert re.search(rf"^shoal \| host2: worker:1 pid {old_task} \(.*\) still ran after its agent was lost;"
                         r" killed before the restart$", text, re.M), text
        assert f"shoal | host2: its lost agent (pid {agent}) still ran; killed" in text, text
        procs.wait_until(lambda: not psutil.pid_exists(agent) or psutil.Process(agent).status() == psutil.STATUS_ZOMBIE,
                         timeout=10, what="the stopped agent gone")
        assert not psutil.pid_exists(old_task) or psutil.Process(old_task).status() == psutil.STATUS_ZOMBIE
        job = wait_running(shoal, 2)
        new_task = [t["pid"] for t in job["tasks"] if t["name"] == "worker.1"][0]
        assert new_task != old_task
        stop.write_text("")
        assert launcher.wait(60) == 0, shoal.output(launcher)
        assert shoal.job()["state"] == "SUCCEEDED"
    finally:
        try:
            os.kill(agent, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_nothing_left(hosts[:2])


def apart_host(host, host_network, tmp_path: Path, hidden: Path) -> subprocess.Popen:
    """`host` once more, as `apart` in tmp_path/ssh_config (every host of the run's ssh_config
    besides): an sshd at port 2222 in a mount namespace of its own, where a tmpfs hides `hidden`,
    as on a machine with a disk of its own. Returns that sshd (a process of the host)."""
    sshd_config = tmp_path / "sshd_config"
    sshd_config.write_text((host.workdir / "sshd_config").read_text().replace("Port 22\n", "Port 2222\n")
                           .replace(str(host.workdir / "sshd.pid"), str(tmp_path / "sshd.pid")))
    sshd = host.popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       f"mount -t tmpfs none {hidden} && exec /usr/sbin/sshd -D -f {sshd_config}"
                       f" -E {tmp_path / 'sshd.log'}"])
    procs.wait_until(lambda: procs.tcp_open(host.address, 2222), timeout=15, what=f"the second sshd of {host.name}")
    config = host_network.ssh_config.read_text()
    block = config[config.index(f"Host {host.name}"):].split("\n\n")[0]
    config += "\n" + block.replace(f"Host {host.name}", "Host apart").replace("Port 22", "Port 2222") \
        + f"\n    HostKeyAlias {host.name}\n"
    (tmp_path / "ssh_config").write_text(config)
    return sshd


def test_sync_copies_the_workdir_to_every_host_first(shoal, hosts, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("import os; print('hello from', os.environ['SHOAL_TASK'])\n")
    (tmp_path / "job.yaml").write_text(f"name: synced\nrun: python hello.py\nroles: {{worker: {{count: 2}}}}\n"
                                       f"workdir: {work}\nsync: true\n")
    out = shoal.run("train", str(tmp_path / "job.yaml"), "--hosts", "host1,host2", "--ssh-config",
                    shoal.ssh_config, timeout=60)
    assert out.returncode == 0, out.stdout
    assert f"shoal | copied {work} to host1, host2 (sync: true)" in out.stdout
    assert "synced.worker.1 | hello from worker:1" in out.stdout
    wait_nothing_left(hosts[:2])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_sync_interrupted_by_a_signal_to_the_launcher_leaves_no_copy_running(shoal, hosts, host_network,
                                                                                tmp_path, sig):
    work = tmp_path / "work"
    work.mkdir()
    (work / "hello.py").write_text("print('hello')\n")
    (work / "data.bin").write_bytes(os.urandom(24 << 20))  # 24 s at 8 mbit/s
    host = hosts[2]
    sshd = apart_host(host, host_network, tmp_path, work)  # a host that does not have `work` yet
    host.shape("8mbit")
    (tmp_path / "job.yaml").write_text(f"name: syncint\nrun: python hello.py\nroles: {{worker: {{count: 1}}}}\n"
                                       f"workdir: {work}\nsync: true\n")
    launcher = shoal.start("train", str(tmp_path / "job.yaml"), "--hosts", "apart", "--ssh-config",
                           str(tmp_path / "ssh_config"))

    def on_host() -> list[int]:
        return [p for p in host.pids() if p not in (host.sshd_pid, sshd.pid)]

    def copy() -> list[tuple[int, float]]:
        """The launcher's rsync and ssh, once the host's rsync runs too."""
        tree = []
        for p in psutil.Process(launcher.pid).children(recursive=True):
            try:
                if p.name() in ("rsync", "ssh") and (known := procs.identity(p.pid)):
                    tree.append(known)
            except psutil.Error:
                continue
        return tree if len(tree) >= 2 and on_host() else []

    procs.wait_until(copy, timeout=30, what="rsync copying to apart", detail=lambda: shoal.output(launcher))
    copying = copy()
    time.sleep(1)
    os.kill(launcher.pid, sig)
    code = launcher.wait(30)
    if sig != signal.SIGKILL:
        assert code == 130, shoal.output(launcher)
        assert f"shoal | stopped by {sig.name} while copying {work} to apart (sync: true)" in shoal.output(launcher)
    procs.wait_until(lambda: not [i for i in copying if procs.identity(i[0]) == i] and not on_host(), timeout=10,
                     what="no rsync or ssh of the copy left, here or on the host",
                     detail=lambda: f"here: {_describe([i[0] for i in copying if procs.identity(i[0]) == i])};"
                                    f" on {host.name}: {_describe(on_host())}")


def test_a_host_that_does_not_share_the_model_dir_gets_its_tasks_files_copied_back(shoal, hosts, host_network,
                                                                                     tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    # host3 once more, where a tmpfs hides the launcher's model dir
    apart_host(hosts[2], host_network, tmp_path, model)
    # ps.0 and worker.1 on `apart`, worker.0 (the chief) on host1
    out = shoal.run("run", "--name", "apart", "--ps", "1", "--workers", "2", "--hosts", "apart,host1",
                    "--ssh-config", str(tmp_path / "ssh_config"), "--output-dir", str(model), "--",
                    "python", "examples/mnist_softmax.py", "--steps", "300", "--log_every", "10",
                    timeout=120)
    assert out.returncode == 0, out.stdout
    assert f"shoal | apart does not share the model dir: copied what its tasks wrote there (not checkpoints)" \
           f" into {model}" in out.stdout
    assert "host1 does not share" not in out.stdout
    assert list((model / "worker_1").glob("events.out.tfevents.*"))  # worker.1's summaries, from apart
    assert list(model.glob("events.out.tfevents.*")) and (model / "checkpoints").is_dir()  # the chief's, here
    assert not list(model.glob(".shoal-launcher-*"))
    job = shoal.job()
    assert not any(job_processes(hosts, job["id"]).values())
    wait_nothing_left(hosts[:2])


def test_a_hosts_job_scan_sees_only_that_hosts_processes(hosts):
    """The test hosts share this machine's process table, as containers on one machine do: a
    scan on host1 must not report (or kill) host2's processes of the same job."""
    job = f"scan-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, SHOAL_JOB_ID=job, SHOAL_TASK="worker:1")
    on_host2 = hosts[1].popen(["sleep", "300"], env=env)
    try:
        def scan(host, *flags):
            out = host.run([sys.executable, "-m", "shoal.launch.agent", "--find", job, *flags], timeout=30)
            return {p["pid"] for p in json.loads(out.stdout)["processes"]}

        procs.wait_until(lambda: on_host2.pid in scan(hosts[1]), timeout=10, what="host2's scan finding its task")
        assert scan(hosts[0], "--kill") == set()
        assert on_host2.poll() is None  # host1's --kill left host2's task alone
    finally:
        os.killpg(on_host2.pid, signal.SIGKILL)
        on_host2.wait(10)
