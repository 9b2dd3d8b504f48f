"""Before any task starts: reach every host of a job at once and start its agent, or fail with
one clear line per bad host (unreachable, key refused, unknown host key, no such interpreter or
workdir, Shoal missing or of another version).

The check *is* the start of the agents: each host's agent command (ssh.agent_command) first
tests the workdir and the interpreter, then the agent says hello with its Shoal version and the
fingerprint of its Shoal code (fingerprint.py): a host must match both, so a checkout at another
commit (same package version) is refused too, and so is an agent too old to send a fingerprint.
So a good host costs one ssh connection, which the job then keeps.

`open_agents` blocks for at most its timeout (all hosts are waited for together);
`explain` is pure. Thread-safe, but `open_agents` must run on a thread that outlives the job
(the agents' commands die with it).
"""

from __future__ import annotations

import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

from shoal.launch.agent_client import AgentConnection, AgentError
from shoal.launch.errors import HostsError
from shoal.launch.ssh import NO_PYTHON, NO_WORKDIR

SSH_FAILED = 255
"""ssh's exit code for its own errors (connection, authentication)."""

_UNREACHABLE = ("timed out", "No route to host", "Network is unreachable", "Connection refused",
                "Connection reset", "Connection closed", "not responding")


def explain(host: str, returncode: Optional[int], stderr: str, *, python: str, workdir: str,
            version: str, waited: float, config: Optional[str] = None) -> str:
    """What went wrong on `host`, in one line that says how to fix it, from how its agent
    command ended (`returncode` None: it still ran after `waited` seconds) and its stderr.
    `config`: the ssh config file the job uses (`ssh -F`), which the fixes it names then use."""
    last = stderr.strip().splitlines()[-1].strip() if stderr.strip() else ""
    said = f" ({last})" if last else ""
    if returncode is None:
        return f"{host}: no answer within {waited:g}s{said}; check that it is up, or raise ssh.connect_timeout"
    if returncode == NO_WORKDIR:
        return (f"{host}: no directory {workdir} there; use the same paths on every host, or set"
                " sync: true to copy the working directory there first")
    if returncode == NO_PYTHON:
        return (f"{host}: no interpreter {python} there; install that Python there (the same path on every"
                " host), or set ssh.python in the spec to the interpreter the hosts have")
    if returncode == SSH_FAILED:
        return ssh_problem(host, stderr, config) or f"{host}: ssh failed{said}"
    if "No module named" in stderr:
        return (f"{host}: {python} cannot import Shoal there{said}; install Shoal {version} there, or set"
                " sync: true if it lives in the working directory")
    return f"{host}: the agent exited with code {returncode}{said}"


def is_unreachable(host: str, problem: str) -> bool:
    """Whether `problem` (a line of `explain`'s or `ssh_problem`'s for `host`) says the host did not
    answer, which may pass (a host coming back), rather than that it cannot run the job."""
    return problem.startswith((f"{host}: unreachable", f"{host}: no answer within"))


def ssh_problem(host: str, stderr: str, config: Optional[str] = None) -> Optional[str]:
    """The line for an ssh failure that `stderr` shows (refused key, unknown host key, unknown
    name, unreachable host), None if it shows none. It quotes ssh's own line (not a trailer
    that rsync, running ssh, adds after it), and the commands it suggests use `config` (the
    job's `ssh -F` file) when one is given, since the host's name may exist only there."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    ssh = f"ssh -F {shlex.quote(config)}" if config else "ssh"
    copy_id = f"ssh-copy-id -F {shlex.quote(config)}" if config else "ssh-copy-id"

    def quoted(*words: str) -> str:
        line = next((line for line in lines if any(word in line for word in words)), lines[-1] if lines else "")
        return f" ({line})" if line else ""

    if "Permission denied" in stderr:
        return (f"{host}: ssh refused the login{quoted('Permission denied')}; add your key there"
                f" ({copy_id} {host}) or load it into your ssh-agent")
    if "IDENTIFICATION HAS CHANGED" in stderr or "has changed and you have requested strict checking" in stderr:
        remove = next((line for line in lines if line.startswith("ssh-keygen ") and " -R " in line), None)
        if remove is None:  # an ssh that prints no "remove with:": from where it found the old key, and for what
            held = re.search(r"Offending \S+ key in (\S+):\d+", stderr)
            name = re.search(r"[Hh]ost key for (\S+) has changed", stderr)
            remove = (f"ssh-keygen{f' -f {shlex.quote(held.group(1))}' if held else ''} -R "
                      f"{shlex.quote(name.group(1)) if name else host}")
        return (f"{host}: its host key has changed since it was last accepted{quoted('ost key for')};"
                f" if the machine was reinstalled, remove the old key ({remove}) and run `{ssh} {host}` once to"
                " check and accept the new one; if not, something else may answer for it: find out before you do")
    if "Host key verification failed" in stderr:
        return (f"{host}: its host key is not known here{quoted('host key is known', 'Host key verification failed')};"
                f" run `{ssh} {host}` once to check and accept it")
    if "Could not resolve hostname" in stderr:
        where = (f"add a Host block for it to {config}" if config else
                 "add a Host block for it to ~/.ssh/config (or give your ssh config with --ssh-config FILE)")
        return f"{host}: unknown host name{quoted('Could not resolve hostname')}; fix the name, or {where}"
    if any(word in stderr for word in _UNREACHABLE):
        return f"{host}: unreachable{quoted(*_UNREACHABLE)}; check that it is up and runs sshd"
    return None


def open_agents(hosts: Sequence[str], connect: Callable[[str], AgentConnection], *, timeout: float,
                python: str, workdir: str, version: str, fingerprint: Optional[str],
                config: Optional[str] = None) -> dict[str, AgentConnection]:
    """Start an agent on every host in parallel and wait for their hellos (at most `timeout`
    seconds in all); check each one's Shoal version and code `fingerprint` (None: the version
    only) (`config`: the ssh config file, for the fixes a failure line names). Returns the
    connections by host;
    HostsError (one line per bad host) after closing them all if any host failed."""
    conns = {host: connect(host) for host in hosts}
    problems = []
    try:
        for conn in conns.values():
            conn.launch()  # all of them first: the connections go on in parallel
        deadline = time.monotonic() + timeout
        for host, conn in conns.items():
            try:
                hello = conn.ready(max(0.0, deadline - time.monotonic()))
            except AgentError:
                problems.append(_failed(host, conn, python=python, workdir=workdir, version=version,
                                        waited=timeout, config=config))
                continue
            if hello.version != version or (fingerprint is not None and hello.fingerprint != fingerprint):
                problems.append(other_shoal(host, hello.version, hello.fingerprint, version, fingerprint))
    except BaseException:
        close_all(conns.values(), timeout=2.0)
        raise
    if problems:
        close_all(conns.values(), timeout=2.0)
        count = f"{len(problems)} of {len(hosts)} hosts" if len(hosts) > 1 else "the host"
        raise HostsError(f"{count} cannot run the job (nothing was started):\n  " + "\n  ".join(problems))
    return conns


def other_shoal(host: str, their_version: str, their_fingerprint: str, version: str, fingerprint: str) -> str:
    """The line for a host whose agent runs other Shoal code than the launcher: another
    version, or the same version from another checkout (their fingerprint "" : an agent too
    old to send one)."""
    theirs = f"code {their_fingerprint}" if their_fingerprint else "an agent too old to report its code"
    return (f"{host}: runs Shoal {their_version} ({theirs}), this launcher Shoal {version} (code {fingerprint});"
            " install the same Shoal there (the same release, or a checkout at the same commit), or set"
            " sync: true if Shoal lives in the working directory")


def close_all(conns: Iterable[AgentConnection], grace: float = 2.0, timeout: float = 15.0) -> None:
    """Close every connection in parallel (each: stop its tasks, TERM -> `grace` -> KILL, and
    kill the command after `timeout` s); blocks until all are closed."""
    threads = [threading.Thread(target=conn.close, args=(grace, timeout), daemon=True) for conn in list(conns)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 10)


def _failed(host: str, conn: AgentConnection, **context) -> str:
    # ssh's own errors come as it exits; give it a moment to say why.
    end = time.monotonic() + 2.0
    while conn.returncode is None and time.monotonic() < end:
        time.sleep(0.02)
    return explain(host, conn.returncode, conn.stderr_text(wait=1.0), **context)
