"""Files between the launcher's machine and the hosts, with rsync over the same ssh (and ssh
options) the agents use.

* `sync: true`: `sync_workdir` copies the job's working directory to every host before anything
  starts: `rsync -a` into the same path there (made if missing), leaving out `.git` and
  `__pycache__`; files only on the host are kept.
* A host that does not share the launcher's model dir: `collect_model_dirs` copies what the
  job's tasks wrote into the model dir there (summaries, the chief's export) back into the
  launcher's, leaving out `checkpoints/` (they stay with the chief, which alone writes them).

Both block until every host is done or the timeout passed; thread-safe. Each copy (rsync and
the ssh it runs) is a process group of its own that does not outlive the call: it is killed
when the call ends early (its timeout, an exception, Ctrl-C), and, through the kernel's
parent-death signal and a watchdog process (local_reaper.Reaper), when the launcher dies, even
by SIGKILL. Killing the local ssh ends the host's `rsync --server` with its connection.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Optional

from shoal.launch.errors import HostsError
from shoal.launch.local_reaper import Reaper
from shoal.launch.parent_death import die_with_parent
from shoal.launch.plan import CHECKPOINTS_DIR
from shoal.launch.processes import signal_group
from shoal.launch.ssh import SshOptions, ssh_base
from shoal.launch.ssh_preflight import ssh_problem

EXCLUDED = (".git/", "__pycache__/")


def rsync_argv(host: str, workdir: str, options: SshOptions) -> list[str]:
    """argv that copies `workdir` to the same path on `host`."""
    source = workdir.rstrip("/") + "/"
    return [options.rsync, "-a", "--protect-args", *(f"--exclude={e}" for e in EXCLUDED),
            "-e", shlex.join(ssh_base(options)),
            "--rsync-path", f"mkdir -p {shlex.quote(source)} && rsync", source, f"{host}:{source}"]


def sync_workdir(hosts: Sequence[str], workdir: str, options: SshOptions, timeout: float = 600.0) -> None:
    """Copy `workdir` to every host, all at once; HostsError with one line per host that failed
    (after `timeout` seconds a host counts as failed)."""
    problems = []
    for host, (code, stderr) in _run_all({h: rsync_argv(h, workdir, options) for h in hosts}, timeout).items():
        if code is None:
            problems.append(f"{host}: copying {workdir} there took over {timeout:g}s")
            continue
        if code != 0:
            last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {code}"
            if "command not found" in stderr or "rsync: not found" in stderr:
                problems.append(f"{host}: rsync is not installed there ({last}); install it, or drop sync: true")
            else:
                problems.append(ssh_problem(host, stderr, options.config)
                                or f"{host}: rsync of {workdir} failed ({last})")
    if problems:
        raise HostsError("sync: true: the working directory could not be copied to"
                         f" {len(problems)} of {len(hosts)} hosts (nothing was started):\n  " + "\n  ".join(problems))


COLLECT_EXCLUDED = (f"{CHECKPOINTS_DIR}/",)


def collect_argv(host: str, model_dir: str, options: SshOptions) -> list[str]:
    """argv that copies `model_dir` on `host` (but its checkpoints) into `model_dir` here."""
    source = model_dir.rstrip("/") + "/"
    return [options.rsync, "-a", "--protect-args", *(f"--exclude={e}" for e in COLLECT_EXCLUDED),
            "-e", shlex.join(ssh_base(options)), f"{host}:{source}", source]


def collect_model_dirs(hosts: Sequence[str], model_dir: str, options: SshOptions,
                       timeout: float = 600.0) -> dict[str, str]:
    """Copy each host's `model_dir` into this machine's, all hosts at once; by host, "" where
    it worked, else why not (one line). A host without the directory has nothing to give."""
    out = {}
    for host, (code, stderr) in _run_all({h: collect_argv(h, model_dir, options) for h in hosts}, timeout).items():
        if code is None:
            out[host] = f"copying its model dir took over {timeout:g}s"
        elif code == 0 or "No such file or directory" in stderr and code == 23:
            out[host] = ""
        else:
            last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {code}"
            out[host] = ssh_problem(host, stderr, options.config) or f"rsync failed ({last})"
    return out


_REAPER_GRACE_S = 1.0
"""How long the watchdog lets a copy's group go after SIGTERM, before SIGKILL, if the launcher dies."""


def _run_all(argvs: dict[str, list[str]], timeout: float) -> dict[str, tuple[Optional[int], str]]:
    """Run one command per host, all at once, each leading a process group of its own; by
    host, its exit code (None: killed after `timeout` seconds in all) and its stderr. Blocks up
    to `timeout`. However it ends, no group it started is left running."""
    reaper = Reaper(grace=_REAPER_GRACE_S)
    reaper.start()
    procs: dict[str, subprocess.Popen] = {}
    try:
        for host, argv in argvs.items():
            procs[host] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, start_new_session=True,
                                           preexec_fn=die_with_parent(os.getpid()))
            reaper.add(procs[host].pid)
        deadline = time.monotonic() + timeout
        out: dict[str, tuple[Optional[int], str]] = {}
        for host, proc in procs.items():
            try:
                _, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                out[host] = (None, "")
                continue
            out[host] = (proc.returncode, err.decode(errors="replace"))
        return out
    finally:
        for proc in procs.values():
            if proc.poll() is None:  # not reaped yet, so its group id is still its own
                signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
            reaper.remove(proc.pid)
        reaper.close()
