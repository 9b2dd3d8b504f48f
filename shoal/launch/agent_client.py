"""`AgentConnection`: the launcher's end of one host agent (`shoal.launch.agent`), reached
through a command that runs it there (`ssh HOST python -m shoal.launch.agent`, or an `srun`
step), and `AgentTask`, one task started through it (an executor.TaskHandle).

The command runs in its own session and dies with the launcher (parent-death signal, tied to the
thread that calls `launch`/`open`: call it from one that outlives the job): when it goes, the
agent's stdin closes and the agent stops every task it started. One reader thread per connection
routes the agent's messages: output and exits to their task, answers to the one request waiting
for them. Requests are serialized by a lock, writes by another; every wait is bounded.

With `heartbeat=S` both ends watch the line: the agent (`--heartbeat S` in its command) says
`heartbeat` every second and a keepalive thread here does the same; after S seconds without a
line from the agent the connection counts as lost (a host that vanished from the network sends
no FIN, so ssh itself would wait for minutes): the command is killed, and every task on it ends
with LOST after a last output line that says why. The agent, hearing nothing, stops its tasks.

Each task's output waits for the console in an `OutputBuffer` of `output_buffer_bytes` (8 MiB
by default): the reader thread never blocks on a console that falls behind; the oldest output is
dropped instead, and the task's log says how much (shoal/launch/output_buffer.py).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

from shoal.launch.agent_protocol import AGENT_TYPES, AgentProtocolError, decode, encode, line_bytes
from shoal.launch.errors import LaunchError, StartError
from shoal.launch.executor import TaskRef
from shoal.launch.output_buffer import DEFAULT_LIMIT_BYTES, OutputBuffer
from shoal.launch.parent_death import die_with_parent
from shoal.launch.processes import signal_group
from shoal.launch.visible_gpus import VisibleGpus

LOST = 255
"""The exit code of a task whose agent connection was lost (ssh's own code for that)."""

_END = object()


class AgentError(LaunchError):
    """An agent could not be reached, or did not do what it was asked."""


@dataclass(frozen=True)
class AgentHello:
    """What an agent says first: Shoal's version there, its Python, the address the
    launcher reached it at, its pid, "JOB.STEP" when it runs as a Slurm step, and the
    fingerprint of its Shoal code ("" from an agent too old to say it)."""

    version: str
    python: str
    host: str
    pid: int
    slurm_step: str = ""
    fingerprint: str = ""
    started: Optional[float] = None
    """The agent's create time (None from an agent too old to say it): with `pid`, what names
    it on its host for a later kill (job_scan.find_args' `kill_agent`)."""


@dataclass(frozen=True)
class Bound:
    """Ports an agent holds for the job, and the GPUs its tasks may use when it was asked."""

    ports: tuple[int, ...]
    gpus: Optional[VisibleGpus] = None


class AgentConnection:
    """One agent. The constructor does no I/O; `launch` starts `argv` (non-blocking) and `ready`
    waits for the agent's hello (`open` does both); `close` stops every task and the agent
    (idempotent). Thread-safe, but `launch` must run on a thread that outlives the job."""

    def __init__(self, argv: Sequence[str], name: str, kind: str, *, env: Optional[Mapping[str, str]] = None,
                 heartbeat: Optional[float] = None, output_buffer_bytes: int = DEFAULT_LIMIT_BYTES):
        self.name = name
        self._output_buffer_bytes = output_buffer_bytes
        self._argv = list(argv)
        self._kind = kind
        self._env = dict(env) if env is not None else None
        self._heartbeat = heartbeat
        self._proc: Optional[subprocess.Popen] = None
        self._replies: queue.Queue = queue.Queue()
        self._request_lock = threading.Lock()
        self._requests = 0  # the number of the last bind request (its answer carries it)
        self._send_lock = threading.Lock()
        self._tasks: dict[str, AgentTask] = {}
        self._tasks_lock = threading.Lock()
        self._reader: Optional[threading.Thread] = None
        self._stderr: list[bytes] = []
        self._stderr_done = threading.Event()
        self._last_heard = time.monotonic()
        self._closing = threading.Event()
        self.lost: Optional[str] = None
        """Why the connection was given up (no heartbeat), None while it was not."""
        self.hello: Optional[AgentHello] = None

    def launch(self) -> None:
        """Start the command; does not wait. Call it from a thread that outlives the job.
        AgentError if the command cannot be run."""
        if self._proc is not None:
            return
        self._last_heard = time.monotonic()
        try:
            self._proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=self._env, start_new_session=True,
                                          preexec_fn=die_with_parent(os.getpid()))
        except OSError as e:
            raise AgentError(f"cannot run {self._argv[0]!r} to start the agent on {self.name}: "
                             f"{e.strerror or e}; check that it is installed and on PATH") from e
        threading.Thread(target=self._read_stderr, daemon=True, name=f"agent-err-{self.name}").start()
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"agent-{self.name}")
        self._reader.start()

    def ready(self, timeout: float) -> AgentHello:
        """Wait for the agent's hello; AgentError (with what the command printed on stderr) if it
        does not come within `timeout` seconds or the command exits. Blocks."""
        message = self._reply("hello", timeout)
        self.hello = AgentHello(str(message.get("version")), str(message.get("python")), str(message.get("host")),
                                int(message.get("pid") or 0), str(message.get("slurm_step") or ""),
                                str(message.get("fingerprint") or ""), _create_time(message.get("started")))
        if self._heartbeat:
            threading.Thread(target=self._keepalive, daemon=True, name=f"agent-beat-{self.name}").start()
        return self.hello

    def open(self, timeout: float) -> AgentHello:
        """`launch`, then `ready(timeout)`."""
        self.launch()
        return self.ready(timeout)

    def bind(self, count: int, interface: str, timeout: float, gpus: bool = False) -> Bound:
        """Have the agent bind and hold `count` ports on `interface` (and, with `gpus`, name the
        GPUs its tasks may use). Each request has its number, which the answer carries, so the
        late answer to an earlier request that timed out is dropped. AgentError if the agent does
        not answer in time, or answers with another number of ports or without the GPUs."""
        with self._request_lock:
            self._requests += 1
            number = self._requests
            self._send({"type": "bind", "count": count, "interface": interface, "gpus": gpus, "request": number})
            reply = self._reply("ports", timeout, request=number)
        ports = reply.get("ports")
        if not isinstance(ports, list) or len(ports) != count or (gpus and "gpus" not in reply):
            asked = f"{count} port(s) and its GPUs" if gpus else f"{count} port(s)"
            got = str(ports)[:100] + ("" if "gpus" in reply or not gpus else " and no GPUs")
            raise AgentError(f"the agent on {self.name} answered a request for {asked} with {got};"
                             " is the same Shoal installed there?")
        return Bound(tuple(int(p) for p in ports), _visible_gpus(reply) if "gpus" in reply else None)

    def start(self, task: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, port: Optional[int],
              timeout: float, *, inherit_env: bool = False,
              extra: Sequence[tuple[str, str]] = ()) -> "AgentTask":
        """Start a task through the agent; StartError if its program cannot be run there, AgentError
        if the agent does not answer. `inherit_env`: the task gets the agent's environment under
        `env`. `extra` goes into the task's TaskRef."""
        handle = AgentTask(self, task, self._output_buffer_bytes)
        with self._tasks_lock:
            self._tasks[task] = handle
        try:
            with self._request_lock:
                self._send({"type": "start", "task": task, "argv": list(argv), "env": dict(env), "cwd": cwd,
                            "port": port, "inherit": inherit_env})
                message = self._reply(("started", "exit"), timeout, task=task)
        except AgentError:
            handle._exited(LOST)
            raise
        if message["type"] == "exit":
            raise StartError(f"{task} on {self.name}: {message.get('error') or 'could not start'}")
        handle.ref = TaskRef(self._kind, pid=int(message["pid"]), started=message.get("started"), host=self.name,
                             extra=tuple(sorted({"agent_pid": str(self.hello.pid if self.hello else 0),
                                                 **dict(extra)}.items())))
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
        self._closing.set()
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._send({"type": "stop", "grace": grace})
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if self._reader is not None:
            self._reader.join(5)

    @property
    def alive(self) -> bool:
        """Whether the command runs and the connection was not given up."""
        return self._proc is not None and self._proc.poll() is None and self.lost is None

    @property
    def returncode(self) -> Optional[int]:
        """The command's exit code once it exited (ssh: 255 for its own errors)."""
        return None if self._proc is None else self._proc.poll()

    def stderr_text(self, wait: float = 0.0) -> str:
        """What the command printed on stderr (its first 20 lines); waits up to `wait` s for
        the stream to end."""
        self._stderr_done.wait(wait)
        return b"".join(self._stderr).decode(errors="replace").strip()

    # --- internals ---------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise AgentError(f"the agent on {self.name} is not running")
        try:
            with self._send_lock:
                proc.stdin.write(encode(message))
                proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as e:
            if message["type"] not in ("stop", "heartbeat"):
                raise AgentError(f"lost the connection to the agent on {self.name}{self._why()}") from e

    def _reply(self, kinds: Union[str, Sequence[str]], timeout: float, **match: Any) -> dict[str, Any]:
        kinds = (kinds,) if isinstance(kinds, str) else kinds
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
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
            self._last_heard = time.monotonic()
            try:
                message = decode(line, AGENT_TYPES)
            except AgentProtocolError:
                continue  # e.g. a login banner; the agent's own lines are always JSON
            kind, task = message["type"], self._tasks.get(message.get("task", ""))
            if kind == "heartbeat":
                continue
            if kind == "output" and task is not None:
                task._chunks.put(line_bytes(str(message.get("data", ""))))  # never blocks (bounded, drops)
            elif kind == "exit" and task is not None and task._started:
                task._exited(int(message.get("code", LOST)))
            else:
                if kind == "started" and task is not None:
                    task._started = True  # before anyone can see its exit
                self._replies.put(message)
        self._replies.put(_END)
        with self._tasks_lock:
            tasks = list(self._tasks.values())
        if not self._closing.is_set():
            self._stderr_done.wait(1.0)
            try:
                self._proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
        code = self._proc.poll()
        why = self.lost or self._why().lstrip(": ") or \
            f"its command ended{'' if code is None else f' with exit code {code}'}"
        for task in tasks:  # no-op for those that already ended
            task._exited(LOST, f"shoal: lost the agent on {self.name} ({why}); the task counts as failed\n",
                         lost_host=self.name)

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            if len(self._stderr) < 20:
                self._stderr.append(line)
        self._stderr_done.set()

    def _keepalive(self) -> None:
        """Say `heartbeat` every second (or every S/4); give the connection up after S seconds
        without a line from the agent."""
        assert self._heartbeat and self._proc is not None
        every = min(1.0, self._heartbeat / 4)
        while not self._closing.wait(every) and self._proc.poll() is None:
            silent = time.monotonic() - self._last_heard
            if silent > self._heartbeat:
                self.lost = f"no heartbeat for {self._heartbeat:g}s"
                signal_group(self._proc.pid, signal.SIGKILL)
                return
            self._send({"type": "heartbeat"})

    def _why(self) -> str:
        text = b"".join(self._stderr).decode(errors="replace").strip()
        return f": {text.splitlines()[-1]}" if text else ""


class AgentTask:
    """One task started through an agent (see executor.TaskHandle). `wait` and `output` are
    for one thread each; `signal` and `close` are thread-safe. Its output waits for `output` in
    a buffer of `output_buffer_bytes` that drops the oldest (see the module docstring)."""

    def __init__(self, connection: AgentConnection, name: str, output_buffer_bytes: int = DEFAULT_LIMIT_BYTES):
        self._connection = connection
        self._name = name
        self._chunks = OutputBuffer(name, output_buffer_bytes)
        self._done = threading.Event()
        self._code: Optional[int] = None
        self._started = False  # set by the reader thread when the agent said "started"
        self._lock = threading.Lock()
        self.ref: Optional[TaskRef] = None
        self.lost_host: Optional[str] = None
        """The host whose loss (no heartbeat) ended this task (executor.HostLossAware)."""
        self.explain_exit: Optional[Callable[[int], str]] = None
        """What `exit_cause` asks, set by an executor that can tell what ended a task from
        outside (the Slurm executor: its job's state)."""

    def exit_cause(self, code: int) -> str:
        """See executor.ExitExplaining. Blocks as `explain_exit` does."""
        return self.explain_exit(code) if self.explain_exit is not None else ""

    def _exited(self, code: int, last_words: str = "", lost_host: Optional[str] = None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._code = code
            self.lost_host = lost_host
            if last_words and self._started:
                self._chunks.put_line(last_words.encode())
            self._chunks.end()
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
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        if not self._done.is_set():
            self.signal(signal.SIGKILL)
            self._done.wait(10)


def _create_time(value: Any) -> Optional[float]:
    """A create time an agent said, if it is one."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _visible_gpus(reply: Mapping[str, Any]) -> VisibleGpus:
    """The GPUs a "ports" reply names; AgentError if they are not a list of names."""
    ids, limited_by = reply.get("gpus"), reply.get("gpus_from") or ""
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or not isinstance(limited_by, str):
        raise AgentError(f"the agent's GPUs are not a list of names: {str(ids)[:200]}; "
                         "is the same Shoal installed there?")
    return VisibleGpus(tuple(ids), limited_by, unchecked=reply.get("gpus_unchecked") is True)
