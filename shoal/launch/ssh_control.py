"""A job's processes on remote hosts, from any process — the launcher's final check, and `shoal
kill`, `status`, `monitor` and `check` for a recorded job: one ssh call per host (all hosts at
once) runs the agent's one-shot mode (`python -m shoal.launch.agent --find JOB_ID [--task T]
[--kill] [--usage S]`), which finds the job's processes by the SHOAL_JOB_ID in their
environment; job_scan.py reads its report.

`AgentSite` is what it takes to run the agent on a host (interpreter, workdir, variables, ssh
config); the SSH executor keeps it in every TaskRef it hands out, so a later process needs
nothing but the job records. The hosts' answers are JSON, validated field by field
(job_scan.py).

`scan` blocks for at most its timeout; thread-safe.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Optional

from shoal.launch.executor import TaskRef
from shoal.launch.job_scan import HostScan, find_args, read_report
from shoal.launch.ssh import SshOptions, agent_command, ssh_argv
from shoal.launch.ssh_preflight import explain


@dataclass(frozen=True)
class AgentSite:
    """How to run the agent on `host`: `python -m shoal.launch.agent` in `workdir` with `env`
    (the launcher's PYTHONPATH and such) added, through ssh with `ssh_config` (None: ssh's own)."""

    host: str
    python: str
    workdir: str
    env: tuple[tuple[str, str], ...] = ()
    ssh_config: Optional[str] = None

    def command(self, args: Sequence[str]) -> str:
        """The remote command line that runs the agent with `args`."""
        return agent_command(self.python, self.workdir, dict(self.env), args)

    def to_extra(self) -> tuple[tuple[str, str], ...]:
        """The site as TaskRef.extra items."""
        items = {"python": self.python, "workdir": self.workdir, "env": json.dumps(dict(self.env))}
        if self.ssh_config:
            items["ssh_config"] = self.ssh_config
        return tuple(sorted(items.items()))

    @classmethod
    def from_ref(cls, ref: TaskRef) -> "AgentSite":
        """The site a TaskRef of the SSH executor names (bad or missing fields: the defaults,
        which then fail on the host with a clear line)."""
        extra = dict(ref.extra)
        try:
            env = {str(k): str(v) for k, v in json.loads(extra.get("env") or "{}").items()}
        except (ValueError, AttributeError):
            env = {}
        return cls(ref.host, extra.get("python", "python3"), extra.get("workdir", "/"),
                   tuple(sorted(env.items())), extra.get("ssh_config") or None)


def scan(sites: Sequence[AgentSite], job_id: str, *, options: SshOptions, kill: bool = False,
         task: Optional[str] = None, usage: Optional[float] = None, has: Optional[str] = None,
         timeout: Optional[float] = None, kill_agent: Optional[tuple[int, float]] = None) -> dict[str, HostScan]:
    """Ask every site's host (each host once) about job `job_id`; by host. Blocks for at most
    `timeout` seconds (default: the connect timeout plus 20 s); a host that does not answer
    gets an `error`. `kill_agent` (pid, create time; with one site): a lost agent there to kill."""
    args = find_args(job_id, task=task, kill=kill, usage=usage, has=has, kill_agent=kill_agent)
    unique = {site.host: site for site in sites}
    timeout = timeout if timeout is not None else options.connect_timeout + 20.0 + (usage or 0.0)
    procs = {}
    for host, site in unique.items():
        argv = ssh_argv(host, site.command(args), replace(options, config=site.ssh_config or options.config))
        procs[host] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout
    out = {}
    for host, proc in procs.items():
        site = unique[host]
        try:
            stdout, stderr = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[host] = HostScan(host, error=explain(host, None, "", python=site.python, workdir=site.workdir,
                                                     version="", waited=timeout,
                                                     config=site.ssh_config or options.config))
            continue
        report = read_report(host, stdout) if proc.returncode == 0 else None
        if report is None:
            out[host] = HostScan(host, error=explain(host, proc.returncode, stderr.decode(errors="replace"),
                                                     python=site.python, workdir=site.workdir, version="",
                                                     waited=timeout, config=site.ssh_config or options.config))
            continue
        out[host] = report
    return out
