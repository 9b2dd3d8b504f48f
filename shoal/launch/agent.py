"""The host agent: `python -m shoal.launch.agent`, started by the launcher on each host of a job
(over ssh, or as a Slurm step) and spoken to through its stdin and stdout (see
`agent_protocol`).

It binds and *holds* the ports its tasks will use until each task is about to start (so no
other program takes them meanwhile), starts each task in its own process group with the
environment the launcher sent (the job secret travels there, never in argv), streams the
tasks' output lines back, reports exits and resource use, and stops every group it started
when told to, when its stdin closes (the launcher died or the ssh connection dropped) or
when it gets SIGTERM or SIGHUP (scancel, a signalled srun). Tasks also get SIGKILL from the
kernel if the agent itself dies (parent-death signal).

Standard library and psutil only, and nothing of Shoal's runtime, so it starts fast on a host.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

import psutil

from shoal.launch.parent_death import die_with_parent
from shoal.launch.agent_protocol import (LAUNCHER_TYPES, AgentProtocolError, decode, encode, field, line_text)

_CHUNK = 1 << 16
_STOP_GRACE_S = 2.0


class Agent:
    """One agent's state. Commands run on the main thread (tasks are started from it, which
    the parent-death signal needs); each task has a reader and a waiter thread. `send` is
    thread-safe."""

    def __init__(self, out: IO[bytes], host: str, slurm_step: str = ""):
        self._out = out
        self._host = host
        self._slurm_step = slurm_step
        self._lock = threading.Lock()
        self._held: dict[int, socket.socket] = {}
        self._tasks: dict[str, subprocess.Popen] = {}
        self._threads: list[threading.Thread] = []

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            try:
                self._out.write(encode(message))
                self._out.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the launcher is gone; stdin's end will stop us

    def hello(self) -> None:
        hello = {"type": "hello", "version": _version(), "python": sys.executable, "host": self._host,
                 "pid": os.getpid()}
        if self._slurm_step:
            hello["slurm_step"] = self._slurm_step
        self.send(hello)

    def handle(self, message: dict[str, Any]) -> bool:
        """Run one command; returns False when the agent should exit."""
        kind = message["type"]
        if kind == "bind":
            self._bind(field(message, "count", int), message.get("interface") or "0.0.0.0")
        elif kind == "start":
            self._start(message)
        elif kind == "signal":
            self._signal(field(message, "task", str), field(message, "signal", int))
        elif kind == "sample":
            self._sample(float(message.get("interval") or 0.5))
        elif kind == "stop":
            self.stop_all(float(message.get("grace", _STOP_GRACE_S)))
            return False
        return True

    def _bind(self, count: int, interface: str) -> None:
        if not 0 < count <= 1024:
            raise AgentProtocolError(f"bind message: count must be 1..1024, got {count}")
        ports = []
        for _ in range(count):
            sock = socket.socket(socket.AF_INET6 if ":" in interface else socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((interface, 0))
            port = sock.getsockname()[1]
            self._held[port] = sock
            ports.append(port)
        self.send({"type": "ports", "ports": ports})

    def _start(self, message: dict[str, Any]) -> None:
        name = field(message, "task", str)
        argv = field(message, "argv", list)
        env = field(message, "env", dict)
        if name in self._tasks and self._tasks[name].poll() is None:
            raise AgentProtocolError(f"task {name} is already running")
        port = message.get("port")
        held = self._held.pop(port, None) if isinstance(port, int) else None
        if held is not None:
            held.close()  # the task binds it next
        try:
            proc = subprocess.Popen([str(a) for a in argv], cwd=message.get("cwd") or None,
                                    env={str(k): str(v) for k, v in env.items()}, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=die_with_parent(os.getpid()))
        except OSError as e:
            self.send({"type": "exit", "task": name, "code": 127,
                       "error": f"cannot run {argv[0]!r} in {message.get('cwd') or os.getcwd()}: {e.strerror}"})
            return
        self._tasks[name] = proc
        try:
            started = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            started = None
        self.send({"type": "started", "task": name, "pid": proc.pid, "started": started})
        reader = threading.Thread(target=self._read, args=(name, proc), daemon=True, name=f"read-{name}")
        reader.start()
        waiter = threading.Thread(target=self._wait, args=(name, proc, reader), daemon=True, name=f"wait-{name}")
        waiter.start()
        self._threads += [reader, waiter]

    def _read(self, name: str, proc: subprocess.Popen) -> None:
        """Relay the task's output as it comes, in chunks of at most 64 KiB (the launcher cuts
        lines and writes the log file, as for a local task)."""
        for chunk in iter(lambda: proc.stdout.read1(_CHUNK), b""):
            self.send({"type": "output", "task": name, "data": line_text(chunk)})

    def _wait(self, name: str, proc: subprocess.Popen, reader: threading.Thread) -> None:
        code = proc.wait()
        _stop_group(proc.pid, _STOP_GRACE_S)  # what the task left in its group goes with it
        reader.join(5.0)
        self.send({"type": "exit", "task": name, "code": code})

    def _signal(self, name: str, sig: int) -> None:
        proc = self._tasks.get(name)
        if proc is not None and proc.poll() is None:
            _killpg(proc.pid, sig)

    def _sample(self, interval: float) -> None:
        trees: dict[str, list[psutil.Process]] = {}
        for name, proc in self._tasks.items():
            if proc.poll() is None:
                try:
                    leader = psutil.Process(proc.pid)
                    trees[name] = [leader, *leader.children(recursive=True)]
                except psutil.Error:
                    continue
        for procs in trees.values():
            for p in procs:
                _quiet(p.cpu_percent, None)
        time.sleep(min(max(interval, 0.05), 5.0))
        total = psutil.virtual_memory().total
        usage = {name: {"cpu": sum(_quiet(p.cpu_percent, None) or 0.0 for p in procs),
                        "rss": sum((_quiet(p.memory_info) or _NO_MEM).rss for p in procs), "mem_total": total}
                 for name, procs in trees.items()}
        self.send({"type": "usage", "tasks": usage})

    def stop_all(self, grace: float) -> None:
        """TERM every task's group, KILL what is left after `grace` seconds. Blocks."""
        live = [p for p in self._tasks.values() if p.poll() is None or _group_alive(p.pid)]
        for proc in live:
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_group_alive(p.pid) for p in live):
            time.sleep(0.05)
        for proc in live:
            _killpg(proc.pid, signal.SIGKILL)
        for proc in self._tasks.values():
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        for sock in self._held.values():
            sock.close()
        self._held.clear()
        for thread in self._threads:
            thread.join(2.0)


class _NoMem:
    rss = 0


_NO_MEM = _NoMem()


def _quiet(call, *args):
    try:
        return call(*args)
    except psutil.Error:
        return None


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(_quiet(p.status) not in (None, psutil.STATUS_ZOMBIE) for p in psutil.process_iter()
               if _quiet(os.getpgid, p.pid) == pgid)


def _stop_group(pgid: int, grace: float) -> None:
    if not _group_alive(pgid):
        return
    _killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.05)
    _killpg(pgid, signal.SIGKILL)


def _version() -> str:
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _host_address(environ) -> str:
    """The address the launcher reached this host at (ssh's SSH_CONNECTION), else its name."""
    connection = environ.get("SSH_CONNECTION", "").split()
    return connection[2] if len(connection) == 4 else socket.gethostname()


class _Terminated(Exception):
    """SIGTERM or SIGHUP reached the agent (scancel, a signalled srun, a hangup)."""


def _terminate(signum: int, _frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # one stop is enough; let it finish
    raise _Terminated(signum)


def _slurm_step(environ) -> str:
    """"JOB.STEP" when the agent runs as a Slurm step (what scancel needs to end it), else ""."""
    job, step = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_STEP_ID", "")
    return f"{job}.{step}" if job.isdigit() and step.isdigit() else ""


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; Ctrl-C reaches it, not us
    # Dying at once would leave each task's group behind (the parent-death signal reaches only
    # a task's main process): stop them all first, as when stdin closes.
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    agent = Agent(sys.stdout.buffer, _host_address(os.environ), _slurm_step(os.environ))
    agent.hello()
    try:
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            try:
                if not agent.handle(decode(line, LAUNCHER_TYPES)):
                    return 0
            except (AgentProtocolError, OSError) as e:
                agent.send({"type": "error", "message": str(e)})
    except _Terminated as e:
        return 128 + int(e.args[0])
    finally:
        while True:
            try:
                agent.stop_all(_STOP_GRACE_S)
                break
            except _Terminated:
                continue  # the signal came while stopping; the handler ignores any further one
    return 0


if __name__ == "__main__":
    sys.exit(main())
