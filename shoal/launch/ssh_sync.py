"""Files between the launcher's machine and the hosts, with rsync over the same ssh (and ssh
options) the agents use.

* `sync: true`: `sync_workdir` copies the job's working directory to every host before anything
  starts: `rsync -a` into the same path there (made if missing), leaving out `.git` and
  `__pycache__`; files only on the host are kept.
* A host that does not share the launcher's model dir: `collect_model_dirs` copies what the
  job's tasks wrote into the model dir there (summaries, the chief's export) back into the
  launcher's, leaving out `checkpoints/` (they stay with the chief, which alone writes them).

Both block until every host is done or the timeout passed; thread-safe.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Sequence

from shoal.launch.errors import HostsError
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
    procs = {host: subprocess.Popen(rsync_argv(host, workdir, options), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
             for host in hosts}
    deadline = time.monotonic() + timeout
    problems = []
    for host, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            problems.append(f"{host}: copying {workdir} there took over {timeout:g}s")
            continue
        if proc.returncode != 0:
            stderr = err.decode(errors="replace")
            last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {proc.returncode}"
            if "command not found" in stderr or "rsync: not found" in stderr:
                problems.append(f"{host}: rsync is not installed there ({last}); install it, or drop sync: true")
            else:
                problems.append(ssh_problem(host, stderr) or f"{host}: rsync of {workdir} failed ({last})")
    if problems:
        raise HostsError("sync: true: the working directory could not be copied to"
                         f" {len(problems)} of {len(hosts)} hosts (nothing was started):\n  " + "\n  ".join(problems))


COLLECT_EXCLUDED = ("checkpoints/",)


def collect_argv(host: str, model_dir: str, options: SshOptions) -> list[str]:
    """argv that copies `model_dir` on `host` (but its checkpoints) into `model_dir` here."""
    source = model_dir.rstrip("/") + "/"
    return [options.rsync, "-a", "--protect-args", *(f"--exclude={e}" for e in COLLECT_EXCLUDED),
            "-e", shlex.join(ssh_base(options)), f"{host}:{source}", source]


def collect_model_dirs(hosts: Sequence[str], model_dir: str, options: SshOptions,
                       timeout: float = 600.0) -> dict[str, str]:
    """Copy each host's `model_dir` into this machine's, all hosts at once; by host, "" where
    it worked, else why not (one line). A host without the directory has nothing to give."""
    procs = {host: subprocess.Popen(collect_argv(host, model_dir, options), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
             for host in hosts}
    deadline = time.monotonic() + timeout
    out = {}
    for host, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[host] = f"copying its model dir took over {timeout:g}s"
            continue
        stderr = err.decode(errors="replace")
        if proc.returncode == 0 or "No such file or directory" in stderr and proc.returncode == 23:
            out[host] = ""
        else:
            last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {proc.returncode}"
            out[host] = ssh_problem(host, stderr) or f"rsync failed ({last})"
    return out
