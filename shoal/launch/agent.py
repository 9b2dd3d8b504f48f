"""The host agent: `python -m shoal.launch.agent`, started by the launcher on each host of a job
(over ssh, or as a Slurm step) and spoken to through its stdin and stdout (see
`agent_protocol`).

It binds and *holds* the ports its tasks will use until each task is about to start (so no
other program takes them meanwhile), starts each task in its own process group with the
environment the launcher sent (the job secret travels there, never in argv), streams the
tasks' output lines back, reports exits and resource use, and stops every group it started
when told to or when its stdin closes: the launcher died or the ssh connection dropped.
Tasks also get SIGKILL from the kernel if the agent itself dies (parent-death signal); SIGTERM
or SIGHUP to the agent (scancel, a signalled srun, sshd) stop every group first, as a closed
stdin does. Run as a Slurm step, its hello names the step ("JOB.STEP", what scancel needs).

With `--heartbeat S` the agent says `heartbeat` at least once a second and expects a line from
the launcher at least every S seconds; after S seconds of silence (the launcher's host vanished
from the network, no FIN ever came) it stops every group and exits, so a host cut off from its
launcher does not keep the job's tasks running.

One-shot mode, for checks from any process: `python -m shoal.launch.agent --find JOB_ID
[--task worker:1] [--kill] [--usage S] [--has PATH] [--kill-agent PID@STARTED]` prints one JSON
line listing this host's
processes of job JOB_ID (those whose environment holds SHOAL_JOB_ID=JOB_ID, and
SHOAL_TASK=worker:1 with --task; see job_processes.py), kills them with --kill (then lists what
survived), measures them over S seconds with --usage, says whether PATH exists here with --has
(is the launcher's model dir shared?), SIGKILLs a lost agent (one the launcher gave up on, that
may still run, stopped) with --kill-agent, and exits.

Standard library and psutil only, and nothing of Shoal's runtime, so it starts fast on a host.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any, Optional

import psutil

from shoal.launch import job_processes
from shoal.launch.agent_protocol import (LAUNCHER_TYPES, AgentProtocolError, decode, encode, field, line_text)
from shoal.launch.parent_death import die_with_parent
from shoal.launch.processes import group_members, same_process, signal_group, stop_group
from shoal.launch.errors import PlanError
from shoal.launch.fingerprint import code_fingerprint
from shoal.launch.ports import bind_ports

_CHUNK = 1 << 16
_STOP_GRACE_S = 2.0
_SAY_STOPPING_S = 0.5
"""How long a signalled agent waits for its last words to its tasks' output to go out."""


class Agent:
    """One agent's state. Commands run on the main thread (tasks are started from it, which
    the parent-death signal needs); each task has a reader and a waiter thread. `send` is
    thread-safe."""

    def __init__(self, out: IO[bytes], host: str, base_env: Optional[Mapping[str, str]] = None,
                 slurm_step: str = ""):
        self._out = out
        self._host = host
        self._base_env = dict(base_env or {})
        self._slurm_step = slurm_step
        self._lock = threading.Lock()
        self._held: dict[int, socket.socket] = {}
        self._tasks: dict[str, subprocess.Popen] = {}
        self._threads: list[threading.Thread] = []
        self._mid_line: set[str] = set()  # tasks whose output so far ends inside a line

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            try:
                self._out.write(encode(message))
                self._out.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass  # the launcher is gone; stdin's end will stop us

    def hello(self) -> None:
        hello: dict[str, Any] = {"type": "hello", "version": shoal_version(), "fingerprint": code_fingerprint(),
                                 "python": sys.executable, "host": self._host, "pid": os.getpid(),
                                 "started": psutil.Process().create_time()}
        if self._slurm_step:
            hello["slurm_step"] = self._slurm_step
        self.send(hello)

    def handle(self, message: dict[str, Any]) -> bool:
        """Run one command; returns False when the agent should exit."""
        kind = message["type"]
        if kind == "heartbeat":
            pass  # any line counts as one (main's watchdog)
        elif kind == "bind":
            self._bind(field(message, "count", int), message.get("interface") or "0.0.0.0",
                       bool(message.get("gpus")), message.get("request"))
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

    def _bind(self, count: int, interface: str, gpus: bool, request: Any = None) -> None:
        if not (0 < count <= 1024 or (count == 0 and gpus)):
            raise AgentProtocolError(f"bind message: count must be 1..1024 (or 0 with gpus), got {count}")
        ports = []
        for sock in bind_ports(count, interface) if count else ():
            port = sock.getsockname()[1]
            self._held[port] = sock
            ports.append(port)
        reply: dict[str, Any] = {"type": "ports", "ports": ports}
        if isinstance(request, int):
            reply["request"] = request  # so that a late answer is not taken for the next request's
        if gpus:
            from shoal.launch.visible_gpus import visible_gpus  # nvidia-ml-py only when GPUs are wanted
            visible = visible_gpus(self._base_env)
            reply["gpus"], reply["gpus_from"] = list(visible.ids), visible.limited_by
            if visible.unchecked:
                reply["gpus_unchecked"] = True
        self.send(reply)

    def _start(self, message: dict[str, Any]) -> None:
        name = field(message, "task", str)
        argv = field(message, "argv", list)
        env = field(message, "env", dict)
        if message.get("inherit"):  # the agent's own (login) environment, under the launcher's variables
            env = {**self._base_env, **env}
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
            if chunk.endswith(b"\n"):
                self._mid_line.discard(name)
            else:
                self._mid_line.add(name)
            self.send({"type": "output", "task": name, "data": line_text(chunk)})

    def _wait(self, name: str, proc: subprocess.Popen, reader: threading.Thread) -> None:
        code = proc.wait()
        stop_group(proc.pid, _STOP_GRACE_S)  # what the task left in its group goes with it
        reader.join(5.0)
        self.send({"type": "exit", "task": name, "code": code})

    def _signal(self, name: str, sig: int) -> None:
        proc = self._tasks.get(name)
        if proc is not None and proc.poll() is None:
            signal_group(proc.pid, sig)

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

    def say_to_tasks(self, text: str) -> None:
        """Add a line of the agent's to the output of every task still running (shown and logged
        as that task's, on a line of its own). Blocks while the launcher does not read."""
        for name, proc in list(self._tasks.items()):
            if proc.poll() is None:
                start = "\n" if name in self._mid_line else ""
                self.send({"type": "output", "task": name, "data": start + text})

    def stop_all(self, grace: float) -> None:
        """TERM every task's group, KILL what is left after `grace` seconds. Blocks."""
        tasks = list(self._tasks.values())  # the heartbeat watchdog may call this beside the main thread
        live = [p for p in tasks if p.poll() is None or bool(group_members(p.pid))]
        for proc in live:
            signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(bool(group_members(p.pid)) for p in live):
            time.sleep(0.05)
        for proc in live:
            signal_group(proc.pid, signal.SIGKILL)
        for proc in tasks:
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        for sock in list(self._held.values()):
            sock.close()
        self._held.clear()
        deadline = time.monotonic() + _STOP_GRACE_S  # a relay blocked on a dead link must not hold us
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))


class _NoMem:
    rss = 0


_NO_MEM = _NoMem()


def _quiet(call, *args):
    try:
        return call(*args)
    except psutil.Error:
        return None


def shoal_version() -> str:
    """The installed Shoal's version (package metadata), "unknown" without it."""
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _host_address(environ) -> str:
    """The address the launcher reached this host at (ssh's SSH_CONNECTION), else its name."""
    connection = environ.get("SSH_CONNECTION", "").split()
    return connection[2] if len(connection) == 4 else socket.gethostname()


def _slurm_step(environ) -> str:
    """"JOB.STEP" when the agent runs as a Slurm step (what scancel needs to end it), else ""."""
    job, step = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_STEP_ID", "")
    return f"{job}.{step}" if job.isdigit() and step.isdigit() else ""


class _Signalled(SystemExit):
    """SIGTERM or SIGHUP to the agent: it stops every group and exits 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise _Signalled(signum)  # unwinds main, whose `finally` stops every group


def _watch_heartbeat(agent: Agent, timeout: float, last_line: list[float]) -> None:
    """Say `heartbeat` at least once a second; after `timeout` s without a line from the launcher,
    stop every group and exit (the main thread may sit in a read that never returns)."""
    every = min(1.0, timeout / 4)
    while True:
        time.sleep(every)
        if time.monotonic() - last_line[0] > timeout:
            agent.stop_all(_STOP_GRACE_S)
            os._exit(3)
        agent.send({"type": "heartbeat"})


def _one_shot(args: argparse.Namespace) -> int:
    if args.kill:
        found, left = job_processes.kill(args.find, args.task)
        report = {"processes": [p.as_json() for p in found], "survivors": [p.as_json() for p in left]}
    else:
        found = job_processes.find(args.find, args.task)
        if args.usage is not None:
            found = job_processes.measure(found, args.usage)
        report = {"processes": [p.as_json() for p in found]}
    if args.usage is not None:
        from shoal.launch.nvml import gpu_usage  # nvidia-ml-py, when it is installed
        report["mem_total"] = psutil.virtual_memory().total
        report["gpus"] = gpu_usage()
    if args.has:
        report["has"] = os.path.exists(args.has)
    if args.kill_agent:
        report["agent_killed"] = _kill_agent(args.kill_agent)
    report["host"] = socket.gethostname()
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


def _kill_agent(which: str) -> bool:
    """SIGKILL the agent named "PID@CREATE_TIME" (a lost one: stopped, or cut off), its tasks
    with it (their parent-death signal); whether it was there to kill. Only a process created
    then whose command line runs this module: never a later process that reuses the pid."""
    pid, _, started = which.partition("@")
    try:
        proc = same_process(int(pid), float(started))
    except ValueError:
        return False
    try:
        if proc is None or proc.pid == os.getpid() or "shoal.launch.agent" not in proc.cmdline():
            return False
        proc.kill()
        proc.wait(5.0)
    except (psutil.Error, psutil.TimeoutExpired):
        return False
    return True


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m shoal.launch.agent",
                                     description="Shoal's host agent (spoken to over stdin and stdout).")
    parser.add_argument("--heartbeat", type=float, default=None, metavar="S",
                        help="exit, stopping every task, after S seconds without a line from the launcher")
    parser.add_argument("--find", metavar="JOB_ID", help="one shot: list this host's processes of the job")
    parser.add_argument("--task", help="with --find: only the processes of this task (worker:1)")
    parser.add_argument("--kill", action="store_true", help="with --find: SIGKILL them, list survivors")
    parser.add_argument("--has", metavar="PATH", help="with --find: also say whether PATH exists on this host")
    parser.add_argument("--kill-agent", metavar="PID@STARTED",
                        help="with --find: also SIGKILL the (lost) agent of this pid and create time")
    parser.add_argument("--usage", type=float, default=None, metavar="S",
                        help="with --find: measure CPU and memory over S seconds")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = _parse(argv)
    if args.find:
        return _one_shot(args)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides; Ctrl-C reaches it, not us
    agent = Agent(sys.stdout.buffer, _host_address(os.environ), os.environ, _slurm_step(os.environ))
    last_line = [time.monotonic()]
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _exit_on_signal)
        agent.hello()
        if args.heartbeat:
            threading.Thread(target=_watch_heartbeat, args=(agent, args.heartbeat, last_line), daemon=True,
                             name="heartbeat").start()
        for line in sys.stdin.buffer:
            last_line[0] = time.monotonic()
            if not line.strip():
                continue
            try:
                if not agent.handle(decode(line, LAUNCHER_TYPES)):
                    return 0
            except (AgentProtocolError, PlanError, OSError) as e:
                agent.send({"type": "error", "message": str(e)})
    except _Signalled as stopped:
        said = f"shoal: this host's agent got {stopped.signal_name} (scancel, a signalled srun or sshd, a shutdown);" \
               " it stops this task and exits\n"
        telling = threading.Thread(target=agent.say_to_tasks, args=(said,), daemon=True, name="say-stopping")
        telling.start()
        telling.join(_SAY_STOPPING_S)  # a launcher that reads nothing any more must not hold the stop up
        raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second one must not cut the stop short
        agent.stop_all(_STOP_GRACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
