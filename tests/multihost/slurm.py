"""SlurmCluster: a real Slurm on this machine for tests (munged, slurmctld, slurmd n1 and n2).

Everything is private to the run: its own munge key and socket, its own slurm.conf on free
ports, state and spool dirs in a temp dir. Client commands (sbatch, srun, squeue, scancel,
salloc, sinfo) reach it through `env` (SLURM_CONF). Lifecycle: `SlurmCluster(base_env)` does no
I/O; `start()` blocks until sinfo shows both nodes idle (bounded); `close()` cancels every job,
stops the daemons by PID and deletes the dir (idempotent). Not thread-safe. Needs root.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

from shoal.launch.ports import free_ports
from tests.multihost import procs, registry

NODES = ("n1", "n2")
CPUS_PER_NODE = 2
START_TIMEOUT_S = 60
CANCEL_TIMEOUT_S = 30


def slurm_conf_text(*, workdir: Path, munge_socket: Path, ctld_port: int, node_ports: list[int],
                    hostname: str) -> str:
    """slurm.conf for one run: no cgroups, no accounting, one partition `debug` with both nodes."""
    nodes = "\n".join(f"NodeName={n} NodeHostname={hostname} NodeAddr=127.0.0.1 Port={p} "
                      f"CPUs={CPUS_PER_NODE} RealMemory=2000" for n, p in zip(NODES, node_ports))
    return f"""\
# slurm.conf of one shoal multi-host test run (tests/multihost/slurm.py)
ClusterName=shoaltest
SlurmctldHost={hostname}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool/%n
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd.%n.pid
SlurmctldLogFile={workdir}/slurmctld.log
SlurmdLogFile={workdir}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
# a cancelled job gets SIGKILL 5 s after SIGTERM (default 30 s), so teardown stays short
KillWait=5
{nodes}
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """A private Slurm cluster of two nodes on 127.0.0.1."""

    nodes = NODES

    def __init__(self, base_env: dict[str, str]) -> None:
        # An outer Slurm job's variables (SLURM_JOB_ID ...) would steer srun to the wrong job.
        self._base_env = {k: v for k, v in base_env.items() if not k.startswith("SLURM_")}
        self.record: registry.RunRecord | None = None
        self.workdir: Path | None = None
        self._munged: subprocess.Popen | None = None
        self._daemons: list[subprocess.Popen] = []
        self._closed = False

    @property
    def conf(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """Environment for sbatch/srun/squeue/scancel/salloc/sinfo against this cluster (a fresh copy)."""
        return {**self._base_env, "SLURM_CONF": str(self.conf)}

    def run(self, argv: list[str], *, timeout: float = 60, check: bool = True,
            **kwargs) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; blocks <= `timeout` s (else TimeoutExpired)."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=check, **kwargs)

    def job_ids(self) -> list[str]:
        """Ids of the jobs squeue lists (pending, running or completing)."""
        return self.run(["squeue", "-h", "-o", "%i"], timeout=30).stdout.split()

    def node_states(self) -> dict[str, str]:
        """Node name -> sinfo's short state ("idle", "alloc", "down*", ...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30, check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def start(self) -> None:
        """Start munged, slurmctld and both slurmd; blocks until both nodes are idle (< 60 s)."""
        registry.clean_stale()
        self.record = registry.RunRecord.create()
        self.workdir = Path(tempfile.mkdtemp(prefix=self.record.name("-slurm-")))
        self.record.add("dirs", str(self.workdir))
        self.record.add("slurm_confs", str(self.conf))
        # munged wants execute permission for all on the dirs above its socket.
        self.workdir.chmod(0o755)
        self._start_munged()
        for d in ("state", "spool"):
            (self.workdir / d).mkdir()
        hostname = socket.gethostname().split(".")[0]
        ctld_port, *node_ports = free_ports(1 + len(NODES))
        self.conf.write_text(slurm_conf_text(workdir=self.workdir, munge_socket=self.munge_socket,
                                             ctld_port=ctld_port, node_ports=node_ports, hostname=hostname))
        self._start_daemon(["slurmctld", "-D", "-i"], "slurmctld.out")
        for node in NODES:
            self._start_daemon(["slurmd", "-D", "-N", node], f"slurmd.{node}.out")
        procs.wait_until(lambda: self._dead_daemon() is not None
                         or all(self.node_states().get(n) == "idle" for n in NODES),
                         timeout=START_TIMEOUT_S, what=f"sinfo showing {', '.join(NODES)} idle",
                         detail=self._logs, interval=0.5)
        if (dead := self._dead_daemon()) is not None:
            raise procs.FixtureError(f"{dead.args[0]} exited {dead.returncode}:\n{self._logs()}")

    def _start_munged(self) -> None:
        mdir = self.munge_socket.parent
        mdir.mkdir(mode=0o755)
        key = mdir / "munge.key"
        key.touch(mode=0o600)
        key.write_bytes(secrets.token_bytes(1024))
        self._munged = procs.start_daemon(
            ["munged", "--foreground", f"--socket={self.munge_socket}", f"--key-file={key}",
             f"--pid-file={mdir / 'munged.pid'}", f"--seed-file={mdir / 'munged.seed'}",
             f"--log-file={mdir / 'munged.log'}"], mdir / "munged.out")
        self._note_pid(self._munged)
        procs.wait_until(lambda: self._munged.poll() is not None or self._munge_works(), timeout=20,
                         what=f"munged answering on {self.munge_socket}", detail=self._logs)
        if self._munged.poll() is not None:
            raise procs.FixtureError(f"munged exited {self._munged.returncode}:\n{self._logs()}")

    def _munge_works(self) -> bool:
        return subprocess.run(["munge", "-n", "-S", str(self.munge_socket)], capture_output=True,
                              timeout=10).returncode == 0

    def _start_daemon(self, argv: list[str], out: str) -> None:
        proc = procs.start_daemon(argv, self.workdir / out, env=self.env)
        self._daemons.append(proc)
        self._note_pid(proc)

    def _note_pid(self, proc: subprocess.Popen) -> None:
        if (ident := procs.identity(proc.pid)) is not None:
            self.record.add("pids", ident)

    def _dead_daemon(self) -> subprocess.Popen | None:
        return next((p for p in [self._munged, *self._daemons] if p is not None and p.poll() is not None), None)

    def _logs(self) -> str:
        if self.workdir is None:
            return ""
        parts = []
        for path in sorted(self.workdir.glob("*.log")) + sorted(self.workdir.glob("*.out")) \
                + sorted((self.workdir / "munge").glob("*.out")):
            text = path.read_text(errors="replace")
            if text:
                parts.append(f"--- {path.name}:\n{text[-1500:]}")
        return "\n".join(parts)

    @contextmanager
    def controller_down(self):
        """slurmctld stopped for the block, as for maintenance: client commands fail at once;
        the nodes' steps run on. Started again after the block (also on failure), from its
        saved state; blocks until it answers (< 60 s)."""
        procs.stop(self._daemons[0], grace=10)
        try:
            yield
        finally:
            proc = procs.start_daemon(["slurmctld", "-D", "-i"], self.workdir / "slurmctld.out", env=self.env)
            self._daemons[0] = proc
            self._note_pid(proc)
            procs.wait_until(lambda: self._answers_again(proc), timeout=START_TIMEOUT_S,
                             what="slurmctld answering again", detail=self._logs, interval=0.5)

    def _answers_again(self, ctld: subprocess.Popen) -> bool:
        if ctld.poll() is not None:
            raise procs.FixtureError(f"slurmctld exited {ctld.returncode} when started again:\n{self._logs()}")
        return self.run(["squeue", "-h"], timeout=30, check=False).returncode == 0

    def cancel_all(self, timeout: float = CANCEL_TIMEOUT_S) -> None:
        """scancel every job, then wait (<= `timeout` s) until squeue lists none."""
        if ids := self.job_ids():
            self.run(["scancel", *ids], timeout=30, check=False)
        procs.wait_until(lambda: not self.job_ids(), timeout=timeout, what="squeue empty after scancel",
                         detail=lambda: self.run(["squeue"], timeout=30, check=False).stdout, interval=0.5)

    def close(self) -> None:
        """Cancel every job, stop the daemons by PID, kill leftover job processes, delete the dir.

        Idempotent; blocks < ~60 s.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._daemons and self._dead_daemon() is None:
                self.cancel_all()
        finally:
            for proc in reversed(self._daemons):
                procs.stop(proc, grace=5)
            if self._munged is not None:
                procs.stop(self._munged, grace=5)
            if self.record is not None:
                self.record.clean()
