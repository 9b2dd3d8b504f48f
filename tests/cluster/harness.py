"""Real multi-process clusters on 127.0.0.1 for tests: every wait bounded, every process killed."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from shoal.launch.ports import free_ports  # noqa: F401 (the launcher picks ports the same way)

REPO = Path(__file__).resolve().parents[2]

SOFTMAX_OVERLAP = ["--overlap_push", "--learning_rate", "0.25"]
"""examples/mnist_softmax.py async with each push overlapped with the next step: a gradient one
step staler, so half the example's learning rate (at 0.5 the softmax ends at 0.89-0.91 after
1000-6000 steps; at 0.25, 0.91-0.92)."""


@dataclass
class Task:
    name: str
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self, timeout: float = 10) -> int:
        """SIGKILL the task's process group and wait for it (up to `timeout`); its exit code."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.wait(timeout)

    def stacks(self, grace: float = 3.0) -> str:
        """For a task that hangs: SIGABRT it, so that faulthandler (PYTHONFAULTHANDLER, set for
        every task) writes every thread's Python stack into its log; then its output's end."""
        if self.proc.poll() is None:
            try:
                psutil.Process(self.proc.pid).rlimit(psutil.RLIMIT_CORE, (0, 0))  # no core file
                os.kill(self.proc.pid, signal.SIGABRT)
                self.proc.wait(grace)
            except (ProcessLookupError, psutil.Error, subprocess.TimeoutExpired):
                pass
        return self.output()[-6000:]

    def highest_step(self, pattern: str = r"step=(\d+)") -> int:
        """The highest step the task printed so far (`pattern`'s group, per line); 0 before any."""
        return max([int(s) for s in re.findall(pattern, self.output(), re.M)] or [0])

    def wait_for_output(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name} never printed {text!r}; output:\n{self.output()[-3000:]}")
            time.sleep(0.05)


@dataclass
class LocalCluster:
    """A cluster spec on free loopback ports, plus the processes started for it."""

    workdir: Path
    num_ps: int
    num_workers: int
    chief: bool = False
    log_level: str | None = None  # SHOAL_LOG_LEVEL for every task (DEBUG: each replica copy's line)
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    tasks: list[Task] = field(default_factory=list)

    def __post_init__(self) -> None:
        ports = free_ports(self.num_ps + self.num_workers + int(self.chief))
        addr = [f"127.0.0.1:{p}" for p in ports]
        self.spec = {"ps": addr[:self.num_ps], "worker": addr[self.num_ps:self.num_ps + self.num_workers]}
        if self.chief:
            self.spec["chief"] = addr[-1:]

    def env(self, job: str, index: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
        env.update(TF_CONFIG=json.dumps({"cluster": self.spec, "task": {"type": job, "index": index}}),
                   SHOAL_JOB_SECRET=self.secret, PYTHONUNBUFFERED="1", SHOAL_HOME=str(self.workdir / "home"),
                   PYTHONFAULTHANDLER="1")  # Task.stacks: where a hung task is
        if self.log_level is not None:
            env["SHOAL_LOG_LEVEL"] = self.log_level
        return env

    def start(self, job: str, index: int, argv: list[str], spec: dict | None = None) -> Task:
        """Start `python argv...` as task job:index, in its own process group. Does not block.
        `spec`: the cluster this task's TF_CONFIG names, if not the cluster's own (a worker
        that joins a running job)."""
        log = self.workdir / f"{job}{index}.{len(self.tasks)}.log"
        env = self.env(job, index)
        if spec is not None:
            env["TF_CONFIG"] = json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        task = Task(f"{job}:{index}", proc, log)
        self.tasks.append(task)
        return task

    def start_all(self, argv: list[str]) -> None:
        """Start the same program on every task, ps first (between-graph replication)."""
        for i in range(self.num_ps):
            self.start("ps", i, argv)
        if self.chief:
            self.start("chief", 0, argv)
        for i in range(self.num_workers):
            self.start("worker", i, argv)

    def wait_all(self, timeout: float) -> dict[str, int]:
        """Exit codes by task name; raises with every log if anything is still running."""
        deadline = time.monotonic() + timeout
        return {t.name: self.wait_task(t, max(0.1, deadline - time.monotonic())) for t in self.tasks}

    def wait_task(self, task: Task, timeout: float) -> int:
        """`task`'s exit code; AssertionError with every log, and where the task's threads
        are, if it still runs after `timeout` s."""
        try:
            return task.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{task.name} still running after {timeout}s\n{self.dump()}\n"
                                 f"--- {task.name}'s threads:\n{task.stacks()}") from None

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        """Poll `predicate()` until it is true; fail naming `what` after `timeout` seconds, or at
        once if a task ended meanwhile (with every log)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"{what} within {timeout}s\n{self.dump()}"
            assert all(t.proc.poll() is None for t in self.tasks), f"a task ended early\n{self.dump()}"
            time.sleep(0.05)

    def dump(self) -> str:
        return "\n".join(f"--- {t.name} (rc={t.proc.poll()})\n{t.output()[-2000:]}" for t in self.tasks)

    def kill_all(self) -> list[str]:
        """Kill every task's process group; returns the names of tasks that were still alive."""
        alive = []
        for t in self.tasks:
            if t.proc.poll() is None:
                alive.append(t.name)
            try:
                os.killpg(t.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                t.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        return alive


def drain_disconnect_while_idle(rpc, timeout_s: float = 10.0) -> None:
    """Let RpcClient `rpc` read its monitor's disconnect event while no request of it waits, as a
    worker does when the ps dies while it awaits another ps's reply: the connection then never
    counts as lost, zmq reconnects silently, and the client learns of the restart only from a
    reply. (A disconnect read while a request waits counts as that request lost.)"""
    deadline = time.monotonic() + timeout_s
    while not rpc._watch.dropped:
        assert time.monotonic() < deadline, "the client never saw its connection drop"
        rpc._read_monitor()
        time.sleep(0.01)


def run_alone(program: str, *args: str, home: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python PROGRAM ARGS` with no cluster (no TF_CONFIG, no SHOAL_ variables but SHOAL_HOME),
    as a user runs an example alone; bounded, output captured as text."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "OUTPUT_DIR") and not k.startswith("SHOAL_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])), SHOAL_HOME=str(home))
    return subprocess.run([sys.executable, program, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
