"""The host agent (`python -m shoal.launch.agent`), run as a real process and spoken to over its
stdin and stdout exactly as the launcher does through ssh."""

import errno
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from shoal.launch.agent_protocol import line_bytes

SECRET = "f00dfeed" * 8


class AgentUnderTest:
    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, "-m", "shoal.launch.agent", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        self.messages: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.output: dict[str, bytes] = {}

    def _read(self):
        for line in self.proc.stdout:
            self.messages.put(json.loads(line))
        self.messages.put(None)

    def send(self, **message):
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def expect(self, kind, timeout=20.0, **match):
        deadline = time.monotonic() + timeout
        while True:
            message = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            assert message is not None, f"the agent exited while we waited for {kind}"
            if message["type"] == "output":
                self.output[message["task"]] = self.output.get(message["task"], b"") + line_bytes(message["data"])
            if message["type"] == kind and all(message.get(k) == v for k, v in match.items()):
                return message

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@pytest.fixture
def agent():
    started = []

    def make(*args):
        started.append(AgentUnderTest(*args))
        return started[-1]

    yield make
    for a in started:
        a.kill()


def task_program(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_agent_holds_ports_until_their_task_starts_then_the_task_binds_it(agent):
    a = agent()
    assert a.expect("hello")["pid"] == a.proc.pid
    a.send(type="bind", count=2, interface="127.0.0.1")
    ports = a.expect("ports")["ports"]
    for port in ports:
        with socket.socket() as s, pytest.raises(OSError) as held:
            s.bind(("127.0.0.1", port))
        assert held.value.errno == errno.EADDRINUSE
    a.send(type="start", task="ps.0", port=ports[0], env={"PATH": os.environ["PATH"]}, cwd="/",
           argv=task_program(f"import socket; s = socket.socket(); s.bind(('127.0.0.1', {ports[0]})); print('bound')"))
    assert a.expect("exit", task="ps.0")["code"] == 0
    assert a.output["ps.0"] == b"bound\n"


def test_secret_travels_in_the_environment_not_in_argv_and_output_is_relayed(agent):
    a = agent()
    a.expect("hello")
    a.send(type="start", task="worker.1", env={"SHOAL_JOB_SECRET": SECRET, "PATH": os.environ["PATH"]},
           argv=task_program("import os, sys, time; print(len(os.environ['SHOAL_JOB_SECRET'])); "
                             "sys.stdout.write('no newline \\xff'); sys.stdout.flush(); time.sleep(30)"))
    started = a.expect("started", task="worker.1")
    deadline = time.monotonic() + 20
    while b"no newline" not in a.output.get("worker.1", b""):
        assert time.monotonic() < deadline
        a.expect("output", timeout=20)
    assert a.output["worker.1"].startswith(b"64\n")
    for proc in [psutil.Process(a.proc.pid), psutil.Process(started["pid"])]:
        assert SECRET not in " ".join(proc.cmdline())
    a.send(type="signal", task="worker.1", signal=signal.SIGTERM)
    assert a.expect("exit", task="worker.1")["code"] == -signal.SIGTERM


def start_shell_with_two_children(a):
    """Start `sh` running two sleeps through agent `a`; returns its group id and members."""
    a.expect("hello")
    a.send(type="start", task="worker.0", env={"PATH": os.environ["PATH"]},
           argv=["sh", "-c", "sleep 300 & sleep 300 & echo up; wait"])
    pid = a.expect("started", task="worker.0")["pid"]
    a.expect("output", task="worker.0")
    return pid, [p for p in psutil.process_iter() if _pgid(p.pid) == pid]


def test_closed_stdin_stops_every_group_the_agent_started(agent):
    a = agent()
    pid, group = start_shell_with_two_children(a)
    try:
        assert len(group) == 3  # sh and its two sleeps
        a.proc.stdin.close()  # the launcher died, or ssh dropped
        assert a.proc.wait(15) == 0
        gone, alive = psutil.wait_procs(group, timeout=10)
        assert not alive
    finally:
        _killpg_quietly(pid)


def test_unknown_command_gets_an_error_and_the_agent_goes_on(agent):
    a = agent()
    a.expect("hello")
    a.send(type="launch_missiles")
    assert "unknown message" in a.expect("error")["message"]
    a.send(type="bind", count=1, interface="127.0.0.1")
    assert len(a.expect("ports")["ports"]) == 1


def test_a_program_that_cannot_run_exits_127_with_the_reason(agent):
    a = agent()
    a.expect("hello")
    a.send(type="start", task="worker.0", env={}, argv=["/nonexistent/python"])
    exit_message = a.expect("exit", task="worker.0")
    assert exit_message["code"] == 127 and "/nonexistent/python" in exit_message["error"]


def test_sample_reports_cpu_and_memory_of_running_tasks(agent):
    a = agent()
    a.expect("hello")
    a.send(type="start", task="worker.0", env={"PATH": os.environ["PATH"]},
           argv=task_program("x = bytearray(50_000_000); import time; print('ready', flush=True); time.sleep(30)"))
    a.expect("output", task="worker.0")
    a.send(type="sample", interval=0.2)
    usage = a.expect("usage")["tasks"]["worker.0"]
    assert usage["rss"] > 50_000_000 and usage["mem_total"] > usage["rss"] and usage["cpu"] >= 0


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_task_dies_when_its_agent_is_killed(agent):
    a = agent()
    a.expect("hello")
    a.send(type="start", task="worker.0", env={"PATH": os.environ["PATH"]}, argv=["sleep", "300"])
    task = psutil.Process(a.expect("started", task="worker.0")["pid"])
    os.kill(a.proc.pid, signal.SIGKILL)  # only the agent: no cleanup code of its own runs
    a.proc.wait(10)
    task.wait(10)  # raises TimeoutExpired if the task outlived its agent


def test_sigterm_to_the_agent_stops_every_group_grandchildren_included(agent):
    a = agent()
    pid, group = start_shell_with_two_children(a)
    try:
        assert len(group) == 3
        os.kill(a.proc.pid, signal.SIGTERM)  # scancel, sshd, or an admin ends the agent
        said = a.expect("output", task="worker.0")
        assert said["data"] == ("shoal: this host's agent got SIGTERM (scancel, a signalled srun or sshd, a"
                                " shutdown); it stops this task and exits\n"), said  # the task's own line had ended
        a.proc.wait(15)
        gone, alive = psutil.wait_procs(group, timeout=10)
        assert not alive
    finally:
        _killpg_quietly(pid)


def _killpg_quietly(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_agent_stops_its_tasks_and_exits_after_heartbeat_silence(agent):
    a = agent("--heartbeat", "1.5")
    a.expect("hello")
    a.send(type="start", task="worker.0", env={"PATH": os.environ["PATH"]},
           argv=["sh", "-c", "sleep 300 & echo up; wait"])
    pid = a.expect("started", task="worker.0")["pid"]
    a.expect("output", task="worker.0")
    group = [p for p in psutil.process_iter() if _pgid(p.pid) == pid]
    try:
        assert len(group) == 2
        a.expect("heartbeat")  # it says it is alive while we say nothing ...
        assert a.proc.wait(15) != 0  # ... and gives up on us (stdin still open)
        gone, alive = psutil.wait_procs(group, timeout=10)
        assert not alive
    finally:
        _killpg_quietly(pid)


def test_heartbeats_from_the_launcher_keep_the_agent_running(agent):
    a = agent("--heartbeat", "1.0")
    a.expect("hello")
    for _ in range(8):
        a.send(type="heartbeat")
        time.sleep(0.25)
    assert a.proc.poll() is None


def test_inherit_gives_the_task_the_agents_environment_under_the_launchers(agent):
    a = agent()
    a.expect("hello")
    a.send(type="start", task="worker.0", inherit=True, env={"SHOAL_TASK": "worker:0", "HOME": "/nowhere"},
           argv=task_program("import os; print(os.environ['SHOAL_TASK'], os.environ['HOME'], 'PATH' in os.environ)"))
    assert a.expect("exit", task="worker.0")["code"] == 0
    assert a.output["worker.0"] == b"worker:0 /nowhere True\n"


def find_job(*args):
    out = subprocess.run([sys.executable, "-m", "shoal.launch.agent", "--find", *args], capture_output=True,
                         timeout=30, check=True)
    return json.loads(out.stdout)


def test_find_lists_the_jobs_processes_by_environment_even_after_setsid_and_kill_ends_them():
    job = f"probe-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, SHOAL_JOB_ID=job, SHOAL_TASK="worker:3")
    # A task whose child left the task's session (setsid): no group signal reaches it.
    task = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen(['setsid', 'sleep', '300']); print('up', flush=True); time.sleep(300)"],
                            env=env, stdout=subprocess.PIPE, start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], env=dict(os.environ, SHOAL_JOB_ID=job + "-other"),
                             start_new_session=True)
    try:
        assert task.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 10
        while len(found := find_job(job)["processes"]) < 2:
            assert time.monotonic() < deadline, found
            time.sleep(0.1)
        assert {p["task"] for p in found} == {"worker:3"}
        assert task.pid in {p["pid"] for p in found} and other.pid not in {p["pid"] for p in found}
        assert any(p["pgid"] != task.pid and "sleep 300" in p["command"] for p in found)
        report = find_job(job, "--kill")
        assert {p["pid"] for p in report["processes"]} == {p["pid"] for p in found}
        assert report["survivors"] == []
        assert find_job(job)["processes"] == []
        assert other.poll() is None
    finally:
        for proc in (task, other):
            _killpg_quietly(proc.pid)
            proc.wait(10)
        for p in find_job(job, "--kill")["processes"]:
            _killpg_quietly(p["pgid"])


def test_find_with_usage_measures_cpu_and_memory():
    job = f"probe-{os.getpid()}-{time.monotonic_ns()}"
    task = subprocess.Popen([sys.executable, "-c", "x = bytearray(40_000_000); print('up', flush=True); "
                             "import time; time.sleep(300)"], env=dict(os.environ, SHOAL_JOB_ID=job),
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert task.stdout.readline() == b"up\n"
        report = find_job(job, "--usage", "0.2")
        [proc] = report["processes"]
        assert proc["pid"] == task.pid and proc["rss"] > 40_000_000 and proc["cpu"] >= 0
        assert report["mem_total"] > proc["rss"]
    finally:
        _killpg_quietly(task.pid)
        task.wait(10)


def test_find_says_whether_a_path_exists_on_this_host(tmp_path):
    (tmp_path / "marker").write_text("")
    assert find_job("no-such-job", "--has", str(tmp_path / "marker"))["has"] is True
    assert find_job("no-such-job", "--has", str(tmp_path / "absent"))["has"] is False


def test_hello_names_the_slurm_step_the_agent_runs_in():
    from shoal.launch.agent_client import AgentConnection

    argv = [sys.executable, "-m", "shoal.launch.agent"]
    in_step = AgentConnection(argv, "n1", "slurm", env={**os.environ, "SLURM_JOB_ID": "12", "SLURM_STEP_ID": "3"})
    plain = AgentConnection(argv, "host1", "ssh", env={k: v for k, v in os.environ.items()
                                                        if k not in ("SLURM_JOB_ID", "SLURM_STEP_ID")})
    try:
        in_step.launch()
        plain.launch()  # both start before either is waited for
        assert in_step.ready(20).slurm_step == "12.3"
        assert plain.ready(20).slurm_step == ""
    finally:
        in_step.close()
        plain.close()


def test_bind_names_the_gpus_its_environment_leaves_it_as_a_slurm_step_has_them():
    """(A MIG name and index 0: names any host keeps, with or without a GPU; whether NVML could
    check them is said too.)"""
    from shoal.launch.nvml import gpu_count

    messages = b'{"type": "bind", "count": 1, "interface": "127.0.0.1", "gpus": true}\n{"type": "stop"}\n'
    done = subprocess.run([sys.executable, "-m", "shoal.launch.agent"], input=messages, capture_output=True,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="MIG-4f1e,0"), timeout=30)
    [ports] = [m for m in map(json.loads, done.stdout.splitlines()) if m["type"] == "ports"]
    assert ports["gpus"] == ["MIG-4f1e", "0"] and ports["gpus_from"] == "CUDA_VISIBLE_DEVICES=MIG-4f1e,0"
    assert ports.get("gpus_unchecked", False) is (gpu_count() == 0)


def test_bind_with_count_0_only_names_the_gpus_and_is_refused_without_gpus(agent):
    """How the launcher asks a running agent which GPUs it has (a task added to the job, a new
    Slurm step): count 0 with "gpus" binds nothing; count 0 alone is a protocol error, naming it."""
    a = agent()
    a.expect("hello")
    a.send(type="bind", count=0, interface="127.0.0.1")
    assert "count must be 1..1024 (or 0 with gpus), got 0" in a.expect("error")["message"]
    a.send(type="bind", count=-1, interface="127.0.0.1", gpus=True)
    assert "got -1" in a.expect("error")["message"]
    a.send(type="bind", count=0, interface="", gpus=True)
    ports = a.expect("ports")
    assert ports["ports"] == [] and isinstance(ports["gpus"], list)
