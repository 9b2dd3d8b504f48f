"""`AgentConnection` and `AgentTask` (the launcher's end of a host agent) against real agent
processes, run directly on this machine (over ssh in tests/multihost): bounded waits, lost
connections, output and exits."""

import os
import signal
import sys
import time

import psutil
import pytest

from shoal.launch.agent_client import LOST, AgentConnection, AgentError

pytestmark = pytest.mark.timeout(60)
AGENT = [sys.executable, "-m", "shoal.launch.agent"]


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
