"""`AgentConnection` and `AgentTask` (the launcher's end of a host agent) against real agent
processes, run directly on this machine (over ssh in tests/multihost): bounded waits, lost
connections, output and exits."""

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from shoal.launch.agent_client import LOST, AgentConnection, AgentError
from shoal.launch.visible_gpus import VisibleGpus

pytestmark = pytest.mark.timeout(60)
AGENT = [sys.executable, "-m", "shoal.launch.agent"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def connections():
    made = []

    def make(argv, **kwargs):
        made.append(AgentConnection(argv, "here", "test", **kwargs))
        return made[-1]

    yield make
    for conn in made:
        conn.close(grace=0.5, timeout=5)


def test_a_reply_wait_is_bounded_even_while_other_messages_keep_coming(connections):
    chatter = ("import json, sys, time\n"
               "print(json.dumps({'type': 'hello', 'version': '0', 'python': '', 'host': 'h', 'pid': 1}), flush=True)\n"
               "while True:\n"
               "    print(json.dumps({'type': 'usage', 'tasks': {}}), flush=True); time.sleep(0.05)\n")
    conn = connections([sys.executable, "-c", chatter])
    conn.open(timeout=20)
    began = time.monotonic()
    with pytest.raises(AgentError, match="did not answer within 1s"):
        conn.bind(1, "127.0.0.1", timeout=1.0)
    assert time.monotonic() - began < 10


def binding_agent(answer: str) -> list[str]:
    """A stand-in agent: its hello, then for the n-th (from 0) request `ask` the dict `reply`
    that the Python lines `answer` make (json and time are there), printed."""
    body = "".join(f"    {line}\n" for line in answer.splitlines())
    return [sys.executable, "-c",
            "import json, sys, time\n"
            "print(json.dumps({'type': 'hello', 'version': '0', 'python': '', 'host': 'h', 'pid': 1}), flush=True)\n"
            f"for n, line in enumerate(sys.stdin):\n    ask = json.loads(line)\n{body}"
            "    print(json.dumps(reply), flush=True)\n"]


def test_a_late_answer_to_a_bind_that_timed_out_is_not_taken_for_the_next_ones(connections):
    """An agent that answers the first bind 1.5 s late: that request times out, and the next one
    skips its late answer (one port, no GPUs, where none and GPUs were asked for) for its own."""
    conn = connections(binding_agent(
        "time.sleep(1.5 if n == 0 else 0)\n"
        "reply = {'type': 'ports', 'ports': list(range(7000, 7000 + ask['count'])), 'request': ask['request']}\n"
        "if ask['gpus']: reply.update(gpus=['0'], gpus_from='')"))
    conn.open(timeout=20)
    with pytest.raises(AgentError, match="did not answer within 0.5s"):
        conn.bind(1, "127.0.0.1", timeout=0.5)
    time.sleep(1.5)  # its answer has come meanwhile
    bound = conn.bind(0, "", timeout=5, gpus=True)
    assert bound.ports == () and bound.gpus is not None and bound.gpus.ids == ("0",)
    assert conn.bind(2, "127.0.0.1", timeout=5).ports == (7000, 7001)


def test_an_answer_that_does_not_fit_the_bind_is_refused(connections):
    conn = connections(binding_agent("reply = {'type': 'ports', 'ports': [7000], 'request': ask['request']}"))
    conn.open(timeout=20)
    with pytest.raises(AgentError, match=r"answered a request for 0 port\(s\) and its GPUs with \[7000\] and no GPUs"):
        conn.bind(0, "", timeout=5, gpus=True)
    with pytest.raises(AgentError, match=r"answered a request for 2 port\(s\) with \[7000\]"):
        conn.bind(2, "127.0.0.1", timeout=5)


def test_task_output_and_exit_come_through_the_connection(connections):
    conn = connections(AGENT)
    hello = conn.open(timeout=20)
    assert hello.pid > 0
    bound = conn.bind(1, "127.0.0.1", timeout=10)
    task = conn.start("worker.0", [sys.executable, "-c", "print('hi'); raise SystemExit(3)"],
                      {}, "/", bound.ports[0], timeout=10, inherit_env=True, extra=(("job", "j1"),))
    assert dict(task.ref.extra)["job"] == "j1" and task.ref.host == "here"
    assert task.wait(20) == 3
    assert b"".join(task.output()) == b"hi\n"


def test_a_silent_agent_is_given_up_after_the_heartbeat_timeout_and_its_tasks_end_lost(connections):
    conn = connections([*AGENT, "--heartbeat", "30"], heartbeat=1.5)
    conn.open(timeout=20)
    task = conn.start("worker.0", ["sleep", "300"], {}, "/", None, timeout=10, inherit_env=True)
    os.kill(conn.hello.pid, signal.SIGSTOP)  # alive, connected, and silent: as behind a dead link
    try:
        assert task.wait(15) == LOST
        assert "no heartbeat" in conn.lost
        assert b"".join(task.output()).startswith(b"shoal: lost the agent on here (no heartbeat for")
        assert not conn.alive
        psutil.Process(task.ref.pid).wait(10)  # it died with its agent
    finally:
        try:
            os.kill(conn.hello.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_line_that_says_the_agent_was_lost_starts_a_line_of_its_own(connections):
    """A task that was lost in the middle of a line (a progress bar, a print in pieces): the
    launcher's line about it is not glued to that line."""
    conn = connections([*AGENT, "--heartbeat", "30"], heartbeat=1.5)
    conn.open(timeout=20)
    task = conn.start("worker.0", [sys.executable, "-c",
                                   "import sys, time; sys.stdout.write('step 7'); sys.stdout.flush(); time.sleep(300)"],
                      {}, "/", None, timeout=10, inherit_env=True)
    output = task.output()
    assert next(output) == b"step 7"
    os.kill(conn.hello.pid, signal.SIGSTOP)
    try:
        assert task.wait(15) == LOST
        assert b"".join(output).startswith(b"\nshoal: lost the agent on here (no heartbeat for")
    finally:
        try:
            os.kill(conn.hello.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def local_agent(workdir, python=sys.executable):
    """The agent's command line exactly as ssh would hand it to the host's shell, run here."""
    from shoal.launch.ssh import agent_command
    return ["sh", "-c", agent_command(python, str(workdir), {"PYTHONPATH": os.environ.get("PYTHONPATH", "")})]


def test_preflight_names_each_bad_host_and_stops_the_good_ones(tmp_path):
    from shoal.launch.agent import shoal_version
    from shoal.launch.errors import HostsError
    from shoal.launch.fingerprint import code_fingerprint
    from shoal.launch.ssh_preflight import open_agents

    made = {}
    commands = {"good": local_agent(REPO), "nodir": local_agent(tmp_path / "missing"),
                "nopython": local_agent(REPO, python=str(tmp_path / "python9"))}

    def connect(host):
        made[host] = AgentConnection(commands[host], host, "test")
        return made[host]

    with pytest.raises(HostsError) as error:
        open_agents(list(commands), connect, timeout=20, python=sys.executable, workdir=str(REPO),
                    version=shoal_version(), fingerprint=code_fingerprint())
    lines = str(error.value).splitlines()
    assert lines[0] == "2 of 3 hosts cannot run the job (nothing was started):"
    assert lines[1].strip().startswith(f"nodir: no directory {REPO} there")  # the workdir the job names
    assert lines[2].strip().startswith(f"nopython: no interpreter {sys.executable} there")
    assert made["good"].returncode is not None  # its agent was stopped


def test_preflight_refuses_an_agent_of_another_shoal_version():
    from shoal.launch.errors import HostsError
    from shoal.launch.fingerprint import code_fingerprint
    from shoal.launch.ssh_preflight import open_agents

    with pytest.raises(HostsError, match=r"the host cannot run the job .*\n  h: runs Shoal \S+ \(code \w+\), this"
                                         r" launcher Shoal 0\.0\.0-other"):
        open_agents(["h"], lambda host: AgentConnection(local_agent(REPO), host, "test"), timeout=20,
                    python=sys.executable, workdir=str(REPO), version="0.0.0-other", fingerprint=code_fingerprint())


def shoal_copy(tmp_path, edit):
    """A copy of this checkout's `shoal` package under tmp_path/"other", changed by `edit(root)`:
    the same package version, other code (a checkout at another commit); its PYTHONPATH."""
    import shutil

    root = tmp_path / "other"
    shutil.copytree(REPO / "shoal", root / "shoal", ignore=shutil.ignore_patterns("__pycache__"))
    edit(root / "shoal")
    return str(root)


def preflight_with(pythonpath, workdir):
    """open_agents on one host "h" whose agent imports Shoal from `pythonpath` (run in `workdir`,
    which `python -m` puts first on the path), against this launcher's version and fingerprint;
    the HostsError's line for h (None if it passed)."""
    from shoal.launch.agent import shoal_version
    from shoal.launch.errors import HostsError
    from shoal.launch.fingerprint import code_fingerprint
    from shoal.launch.ssh import agent_command
    from shoal.launch.ssh_preflight import close_all, open_agents

    argv = ["sh", "-c", agent_command(sys.executable, str(workdir), {"PYTHONPATH": pythonpath})]
    try:
        conns = open_agents(["h"], lambda host: AgentConnection(argv, host, "test"), timeout=20,
                            python=sys.executable, workdir=str(workdir), version=shoal_version(),
                            fingerprint=code_fingerprint())
    except HostsError as e:
        return str(e).splitlines()[-1].strip()
    close_all(conns.values())
    return None


def test_preflight_refuses_a_shoal_of_the_same_version_whose_code_differs_by_one_byte(tmp_path):
    from shoal.launch.agent import shoal_version
    from shoal.launch.fingerprint import code_fingerprint

    def one_more_byte(shoal):
        (shoal / "lazy.py").write_bytes((shoal / "lazy.py").read_bytes() + b"\n")

    other = shoal_copy(tmp_path, one_more_byte)
    assert preflight_with(str(REPO), tmp_path) is None  # this checkout's own agent passes
    assert preflight_with(other, tmp_path) == (
        f"h: runs Shoal {shoal_version()} (code {code_fingerprint_of(other)}), this launcher Shoal {shoal_version()}"
        f" (code {code_fingerprint()}); install the same Shoal there (the same release, or a checkout at the"
        " same commit), or set sync: true if Shoal lives in the working directory")


def test_preflight_refuses_an_agent_too_old_to_report_its_code_fingerprint(tmp_path):
    def drop_fingerprint(shoal):
        agent = shoal / "launch" / "agent.py"
        text = agent.read_text()
        assert '"fingerprint": code_fingerprint(),' in text
        agent.write_text(text.replace('"fingerprint": code_fingerprint(),', ""))

    line = preflight_with(shoal_copy(tmp_path, drop_fingerprint), tmp_path)
    assert line is not None and "(an agent too old to report its code), this launcher Shoal" in line, line


def code_fingerprint_of(pythonpath):
    """What an agent importing Shoal from `pythonpath` computes, in its own process."""
    import subprocess

    return subprocess.run([sys.executable, "-c", "from shoal.launch.fingerprint import code_fingerprint as f;"
                           " print(f())"], env={**os.environ, "PYTHONPATH": pythonpath}, cwd=pythonpath,
                          capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def test_ssh_executor_places_an_added_task_on_a_free_slot_with_a_held_port(connections, tmp_path):
    """`shoal scale` on an ssh job: `place_task` picks the host with a free slot and the fewest
    tasks and has its agent (a real one, here) bind one more port, held until the task starts."""
    import socket

    from shoal.cluster import TaskId
    from shoal.launch.allocation import Allocation, TaskAllocation, task_ids
    from shoal.launch.errors import PlanError
    from shoal.launch.executor_ssh import SshExecutor
    from shoal.launch.hosts import Host
    from shoal.launch.plan import added_task, make_plan
    from shoal.launch.spec import spec_from_dict

    spec = spec_from_dict({"name": "s", "run": "true", "roles": {"worker": {"count": "2..4"}}})
    places = tuple(TaskAllocation(t, "127.0.0.1", 7000 + i, node=("a", "b")[i])
                   for i, t in enumerate(task_ids(spec)))
    plan = make_plan(spec, Allocation(places, "127.0.0.1", 6999, "/py"), job_id="s-1",
                     shoal_home=tmp_path, workdir=tmp_path, secret="k")
    executor = SshExecutor([Host("a", slots=2), Host("b", slots=1)], python=sys.executable, cwd=tmp_path)
    for name in ("a", "b"):
        conn = connections(AGENT)
        conn.open(timeout=20)
        executor._conns[name] = conn  # the agents allocate() would have started over ssh
    place = executor.place_task(plan, TaskId("worker", 2), plan.tasks)
    assert place.node == "a" and place.port > 0 and place.task == TaskId("worker", 2)
    with socket.socket() as probe, pytest.raises(OSError):
        probe.bind((place.host, place.port))  # the agent holds it
    with pytest.raises(PlanError, match="used its slots"):
        executor.place_task(plan, TaskId("worker", 3), [*plan.tasks, added_task(plan, place, plan.tasks)])


def test_ssh_executor_gives_back_the_slots_of_scaled_down_tasks(connections, tmp_path):
    """Up to 4, down to 2, up to 4 again on one host with 4 slots: the slots of the tasks
    scaled down are free again (place_task counts the tasks that hold their place now)."""
    from shoal.cluster import TaskId
    from shoal.launch.allocation import Allocation, TaskAllocation, task_ids
    from shoal.launch.errors import PlanError
    from shoal.launch.executor_ssh import SshExecutor
    from shoal.launch.hosts import Host
    from shoal.launch.plan import added_task, make_plan
    from shoal.launch.spec import spec_from_dict

    spec = spec_from_dict({"name": "s", "run": "true", "roles": {"worker": {"count": "2..4"}}})
    places = tuple(TaskAllocation(t, "127.0.0.1", 7000 + i, node="a") for i, t in enumerate(task_ids(spec)))
    plan = make_plan(spec, Allocation(places, "127.0.0.1", 6999, "/py"), job_id="s-1",
                     shoal_home=tmp_path, workdir=tmp_path, secret="k")
    executor = SshExecutor([Host("a", slots=4)], python=sys.executable, cwd=tmp_path)
    conn = connections(AGENT)
    conn.open(timeout=20)
    executor._conns["a"] = conn  # the agent allocate() would have started over ssh

    def grow(running, *indices):
        for index in indices:
            running = [*running, added_task(plan, executor.place_task(plan, TaskId("worker", index),
                                                                      running), running)]
        return running

    running = grow(list(plan.tasks), 2, 3)  # worker=4
    with pytest.raises(PlanError, match="used its slots"):
        executor.place_task(plan, TaskId("worker", 4), running)
    running = running[:2]  # worker=2: worker.2 and worker.3 were scaled down
    running = grow(running, 4, 5)  # worker=4 again
    assert [t.name for t in running] == ["worker.0", "worker.1", "worker.4", "worker.5"]
    assert all(t.node == "a" for t in running)


def test_output_the_console_does_not_read_is_bounded_dropping_the_oldest_and_saying_so(connections):
    limit = 256 * 1024
    conn = connections(AGENT, output_buffer_bytes=limit)
    conn.open(timeout=20)
    writer = ("import sys\n"
              "for i in range(40000):\n"
              "    sys.stdout.write(f'line {i:06d} ' + 'x' * 100 + '\\n')\n"
              "sys.stdout.write('the last line\\n')\n")  # about 4.4 MB, far more than the buffer holds
    task = conn.start("worker.0", [sys.executable, "-c", writer], {}, "/", None, timeout=10, inherit_env=True)
    assert task.wait(30) == 0  # nobody read its output meanwhile: the reader thread was never blocked
    out = b"".join(task.output())
    assert len(out) <= limit + 1024
    assert out.endswith(b"the last line\n")  # the newest output is kept
    notes = [line for line in out.splitlines() if line.startswith(b"shoal: dropped")]
    assert len(notes) == 1, notes
    dropped = int(notes[0].split()[2])
    assert notes[0] == (f"shoal: dropped {dropped} bytes of worker.0's output: the console could not keep up "
                        f"(the launcher holds at most {limit} bytes of it)").encode()
    kept = len(out) - len(notes[0]) - 1
    assert kept + dropped == 40000 * 113 + len(b"the last line\n")  # every byte is kept or counted
    first = out.splitlines()[1]
    assert first.startswith(b"line ") and first != b"line 000000 " + b"x" * 100  # the oldest lines went


def test_ssh_executor_places_an_added_gpu_task_on_a_host_with_a_free_gpu_and_gives_it_that_one(connections, tmp_path):
    """`shoal scale` of a role with `gpus: 1` on an ssh job: the task goes to a host whose agent
    names a GPU no running task holds (asked then, for a host that ran no task yet), and gets
    it; with none free anywhere the scale is refused, naming each host's free GPUs. A task
    added without GPUs to such a job is kept off the GPUs of its host."""
    from shoal.cluster import TaskId
    from shoal.launch.allocation import Allocation, TaskAllocation, task_ids
    from shoal.launch.errors import PlanError
    from shoal.launch.executor_ssh import SshExecutor
    from shoal.launch.nvml import gpu_count
    from shoal.launch.visible_gpus import unchecked_notice
    from shoal.launch.hosts import Host
    from shoal.launch.plan import added_task, make_plan
    from shoal.launch.spec import spec_from_dict

    spec = spec_from_dict({"name": "s", "run": "true", "roles": {"ps": {"count": "1..2"}, "chief": {},
                                                                 "worker": {"count": "1..3", "gpus": 1}}})
    places = (TaskAllocation(TaskId("ps", 0), "127.0.0.1", 7002, (), gpu_host=True, node="a"),
              TaskAllocation(TaskId("chief", 0), "127.0.0.1", 7000, (), gpu_host=True, node="a"),
              TaskAllocation(TaskId("worker", 0), "127.0.0.1", 7001, ("MIG-a0",), gpu_host=True, node="a"))
    assert [p.task for p in places] == task_ids(spec)
    plan = make_plan(spec, Allocation(places, "127.0.0.1", 6999, "/py"), job_id="s-1",
                     shoal_home=tmp_path, workdir=tmp_path, secret="k")
    said: list[str] = []
    executor = SshExecutor([Host("a"), Host("b")], python=sys.executable, cwd=tmp_path, notify=said.append)
    for name, gpus in (("a", "MIG-a0"), ("b", "MIG-b0")):  # one GPU each, as their agents see them
        conn = connections(AGENT, env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus})
        conn.open(timeout=20)
        executor._conns[name] = conn  # the agents allocate() would have started over ssh
    executor._gpus_of["a"] = VisibleGpus(("MIG-a0",))  # what a's agent said when the job started

    ps = executor.place_task(plan, TaskId("ps", 1), plan.tasks)  # the least loaded host: b, not asked yet
    assert (ps.node, ps.gpus, ps.gpu_host) == ("b", (), True)
    assert added_task(plan, ps, plan.tasks).env_dict["CUDA_VISIBLE_DEVICES"] == ""

    place = executor.place_task(plan, TaskId("worker", 1), plan.tasks)
    assert (place.node, place.gpus, place.gpu_host) == ("b", ("MIG-b0",), True)
    if gpu_count() == 0:  # b's agent could not check its GPUs, and the launcher said so, once
        assert [line for line in said if "unchecked" in line] == [
            unchecked_notice(VisibleGpus(("MIG-b0",), "CUDA_VISIBLE_DEVICES=MIG-b0", unchecked=True), "b")]
    running = [*plan.tasks, added_task(plan, place, plan.tasks)]
    assert running[-1].env_dict["CUDA_VISIBLE_DEVICES"] == "MIG-b0"
    with pytest.raises(PlanError, match=r"worker:2 asks for 1 GPU\(s\) and no host of the job has that many free "
                                        r"\(free: a 0 of 1, b 0 of 1\)"):
        executor.place_task(plan, TaskId("worker", 2), running)
    again = executor.place_task(plan, TaskId("worker", 2), [t for t in running if t.name != "worker.0"])  # scaled down
    assert (again.node, again.gpus) == ("a", ("MIG-a0",))


def test_ssh_executor_counts_only_the_gpus_held_on_each_host_when_hosts_name_them_alike(connections, tmp_path):
    """Two hosts whose agents both name their GPU "0" (no CUDA_VISIBLE_DEVICES, or the same one):
    worker:0 holding a's "0" leaves b's "0" free, and a's stays taken."""
    from shoal.cluster import TaskId
    from shoal.launch.allocation import Allocation, TaskAllocation
    from shoal.launch.errors import PlanError
    from shoal.launch.executor_ssh import SshExecutor
    from shoal.launch.hosts import Host
    from shoal.launch.plan import added_task, make_plan
    from shoal.launch.spec import spec_from_dict

    spec = spec_from_dict({"name": "s", "run": "true", "roles": {"chief": {}, "worker": {"count": "1..3", "gpus": 1}}})
    places = (TaskAllocation(TaskId("chief", 0), "127.0.0.1", 7000, (), gpu_host=True, node="a"),
              TaskAllocation(TaskId("worker", 0), "127.0.0.1", 7001, ("0",), gpu_host=True, node="a"))
    plan = make_plan(spec, Allocation(places, "127.0.0.1", 6999, "/py"), job_id="s-1",
                     shoal_home=tmp_path, workdir=tmp_path, secret="k")
    executor = SshExecutor([Host("a"), Host("b")], python=sys.executable, cwd=tmp_path)
    for name in ("a", "b"):
        conn = connections(AGENT, env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
        conn.open(timeout=20)
        executor._conns[name] = conn

    place = executor.place_task(plan, TaskId("worker", 1), plan.tasks)
    assert (place.node, place.gpus) == ("b", ("0",))
    running = [*plan.tasks, added_task(plan, place, plan.tasks)]
    with pytest.raises(PlanError, match=r"\(free: a 0 of 1, b 0 of 1\)"):
        executor.place_task(plan, TaskId("worker", 2), running)
