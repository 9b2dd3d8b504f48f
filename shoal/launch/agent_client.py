"""`AgentConnection`: the launcher's end of one host agent (`shoal.launch.agent`), reached
through a command that runs it there (`ssh HOST python -m shoal.launch.agent`, or an `srun`
step), and `AgentTask`, one task started through it (an executor.TaskHandle).

The command runs in its own session and dies with the launcher (parent-death signal): when it
goes, the agent's stdin closes and the agent stops every task it started. One reader thread
per connection routes the agent's messages: output and exits to their task, answers to the
one request waiting for them. Requests are serialized by a lock; every wait is bounded.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from shoal.launch.agent_protocol import AGENT_TYPES, AgentProtocolError, decode, encode, line_bytes
from shoal.launch.errors import LaunchError, StartError
from shoal.launch.executor import TaskRef
from shoal.launch.parent_death import die_with_parent

LOST = 255
"""The exit code of a task whose agent connection was lost (ssh's own code for that)."""

_END = object()


class AgentError(LaunchError):
    """An agent could not be reached, or did not do what it was asked."""


@dataclass(frozen=True)
class AgentHello:
    """What an agent says first: Shoal's version there, its Python, the address the
    launcher reached it at, its pid, and "JOB.STEP" when it runs as a Slurm step."""

    version: str
    python: str
    host: str
    pid: int
    slurm_step: str = ""


class AgentConnection:
    """One agent. The constructor does no I/O; `open` starts `argv` and waits for the agent's
    hello (`launch` then `ready` do the same in two halves, so that several agents start
    at once: launch each from the thread that lives as long as the job, whose end the command
    gets the parent-death signal from, then wait); `close` stops every task and the agent
    (idempotent). Thread-safe."""

    def __init__(self, argv: Sequence[str], name: str, kind: str, *, env: Optional[Mapping[str, str]] = None):
        self.name = name
        self._argv = list(argv)
        self._kind = kind
        self._env = dict(env) if env is not None else None
        self._proc: Optional[subprocess.Popen] = None
        self._replies: queue.Queue = queue.Queue()
        self._request_lock = threading.Lock()
        self._tasks: dict[str, AgentTask] = {}
        self._tasks_lock = threading.Lock()
        self._reader: Optional[threading.Thread] = None
        self._stderr: list[bytes] = []
        self.hello: Optional[AgentHello] = None

    def open(self, timeout: float) -> AgentHello:
        """Start the agent and wait for its hello. AgentError (with what the command printed
        on stderr) if it does not come within `timeout`."""
        self.launch()
        return self.ready(timeout)

    def launch(self) -> None:
        """Start the command that runs the agent; does not wait for it. AgentError if the
        command cannot be run."""
        try:
            self._proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=self._env, start_new_session=True,
                                          preexec_fn=die_with_parent(os.getpid()))
        except OSError as e:
            raise AgentError(f"cannot run {self._argv[0]!r} to start the agent on {self.name}: "
                             f"{e.strerror or e}") from e
        threading.Thread(target=self._read_stderr, daemon=True, name=f"agent-err-{self.name}").start()
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"agent-{self.name}")
        self._reader.start()

    def ready(self, timeout: float) -> AgentHello:
        """Wait for the hello of the agent `launch` started; AgentError (with what the command
        printed on stderr) if it does not come within `timeout`."""
        message = self._reply("hello", timeout)
        self.hello = AgentHello(str(message.get("version")), str(message.get("python")), str(message.get("host")),
                                int(message.get("pid") or 0), str(message.get("slurm_step") or ""))
        return self.hello

    def bind(self, count: int, interface: str, timeout: float) -> list[int]:
        """Have the agent bind and hold `count` ports; returns them."""
        with self._request_lock:
            self._send({"type": "bind", "count": count, "interface": interface})
            return [int(p) for p in self._reply("ports", timeout)["ports"]]

    def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, port: Optional[int],
              timeout: float) -> "AgentTask":
        """Start a task through the agent; StartError if its program cannot be run there."""
        handle = AgentTask(self, task)
        with self._tasks_lock:
            self._tasks[task] = handle
        with self._request_lock:
            self._send({"type": "start", "task": task, "argv": list(argv), "env": dict(env), "cwd": cwd,
                        "port": port})
            message = self._reply(("started", "exit"), timeout, task=task)
        if message["type"] == "exit":
            raise StartError(f"{task} on {self.name}: {message.get('error') or 'could not start'}")
        handle.ref = TaskRef(self._kind, pid=int(message["pid"]), started=message.get("started"), host=self.name,
                             extra=(("agent_pid", str(self.hello.pid if self.hello else 0)),))
        return handle

    def signal(self, task: str, sig: int) -> None:
        self._send({"type": "signal", "task": task, "signal": int(sig)})

    def sample(self, interval: float, timeout: float) -> dict[str, dict[str, Any]]:
        """CPU % and memory of every running task, measured over `interval` seconds."""
        with self._request_lock:
            self._send({"type": "sample", "interval": interval})
            return dict(self._reply("usage", timeout + interval)["tasks"])

    def close(self, grace: float = 2.0, timeout: float = 15.0) -> None:
        """Stop every task (TERM, `grace`, KILL) and the agent. Idempotent; blocks up to
        `timeout` seconds, then kills the command."""
        proc = self._proc
        if proc is None:
            return
        self._send({"type": "stop", "grace": grace})
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if self._reader is not None:
            self._reader.join(5)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- internals ---------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise AgentError(f"the agent on {self.name} is not running")
        try:
            proc.stdin.write(encode(message))
            proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as e:
            if message["type"] != "stop":
                raise AgentError(f"lost the connection to the agent on {self.name}{self._why()}") from e

    def _reply(self, kinds, timeout: float, **match) -> dict[str, Any]:
        kinds = (kinds,) if isinstance(kinds, str) else kinds
        while True:
            try:
                message = self._replies.get(timeout=timeout)
            except queue.Empty:
                raise AgentError(f"the agent on {self.name} did not answer within {timeout:g}s{self._why()}") from None
            if message is _END:
                self._replies.put(_END)
                raise AgentError(f"the agent on {self.name} exited{self._why()}")
            if message["type"] == "error":
                raise AgentError(f"the agent on {self.name} refused: {message.get('message')}")
            if message["type"] in kinds and all(message.get(k) == v for k, v in match.items()):
                return message

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                message = decode(line, AGENT_TYPES)
            except AgentProtocolError:
                continue  # e.g. a login banner; the agent's own lines are always JSON
            kind, task = message["type"], self._tasks.get(message.get("task", ""))
            if kind == "output" and task is not None:
                task._chunks.put(line_bytes(str(message.get("data", ""))))
            elif kind == "exit" and task is not None and task._started:
                task._exited(int(message.get("code", LOST)))
            else:
                if kind == "started" and task is not None:
                    task._started = True  # before anyone can see its exit
                self._replies.put(message)
        self._replies.put(_END)
        with self._tasks_lock:
            tasks = list(self._tasks.values())
        for task in tasks:
            task._exited(LOST)  # no-op for those that already ended

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            if len(self._stderr) < 20:
                self._stderr.append(line)

    def _why(self) -> str:
        text = b"".join(self._stderr).decode(errors="replace").strip()
        return f": {text.splitlines()[-1]}" if text else ""


class AgentTask:
    """One task started through an agent (see executor.TaskHandle). `wait` and `output` are
    for one thread each; `signal` and `close` are thread-safe."""

    def __init__(self, connection: AgentConnection, name: str):
        self._connection = connection
        self._name = name
        self._chunks: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._code: Optional[int] = None
        self._started = False  # set by the reader thread when the agent said "started"
        self.ref: Optional[TaskRef] = None

    def _exited(self, code: int) -> None:
        if not self._done.is_set():
            self._code = code
            self._chunks.put(_END)
            self._done.set()

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        return self._code if self._done.wait(timeout) else None

    def signal(self, sig: int) -> None:
        if not self._done.is_set():
            try:
                self._connection.signal(self._name, sig)
            except AgentError:
                pass  # the agent is gone, and its tasks with it

    def output(self) -> Iterator[bytes]:
        while True:
            chunk = self._chunks.get()
            if chunk is _END:
                return
            yield chunk

    def close(self) -> None:
        if not self._done.is_set():
            self.signal(signal.SIGKILL)
            self._done.wait(10)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
