"""The argv of the system's `ssh` client, and the remote commands Shoal runs through it.

Shoal has no keys or passwords of its own: ssh uses the user's agent, `~/.ssh/config` (or
`-F FILE`) and `known_hosts`. Every call adds `BatchMode=yes` (never a prompt: a refused key
fails at once), a `ConnectTimeout`, and `ServerAliveInterval`/`ServerAliveCountMax` (ssh
gives up on a silent server by itself too, a little after Shoal's own heartbeat would). A remote command is one `sh -c SCRIPT` word
list, quoted for whatever login shell the user has.

Nothing secret ever goes into these argvs, which anyone on either host can read with `ps`:
the job secret and the tasks' environments travel over the channel's stdin (agent_protocol).
Pure: no I/O; thread-safe.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

AGENT_MODULE = "shoal.launch.agent"
NO_WORKDIR = 97
"""The exit code of the agent's command when the workdir does not exist on the host."""
NO_PYTHON = 98
"""... and when the interpreter does not exist (or cannot be run) there."""


@dataclass(frozen=True)
class SshOptions:
    """How to reach hosts: `config` for `ssh -F` (None: ssh's own ~/.ssh/config),
    `connect_timeout` seconds per connection attempt, `heartbeat` seconds of silence after
    which a host counts as lost, and the ssh (and rsync) programs to run."""

    config: Optional[str] = None
    connect_timeout: float = 10.0
    heartbeat: float = 10.0
    ssh: str = "ssh"
    rsync: str = "rsync"


def ssh_base(options: SshOptions) -> list[str]:
    """`ssh` and its options, without the destination (rsync's `-e` takes this)."""
    # ssh's own keepalive gives up after about 1.5 heartbeat timeouts: Shoal's heartbeat comes
    # first and says why, ssh's is the backstop.
    alive = max(1, math.ceil(options.heartbeat / 2))
    argv = [options.ssh]
    if options.config:
        argv += ["-F", options.config]
    return argv + ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, math.ceil(options.connect_timeout))}",
                   "-o", f"ServerAliveInterval={alive}", "-o", "ServerAliveCountMax=3", "-T", "-x"]


def ssh_argv(host: str, remote_command: str, options: SshOptions) -> list[str]:
    """argv that runs `remote_command` (one shell command line) on `host`."""
    return [*ssh_base(options), "--", host, remote_command]


def sh_command(script: str) -> str:
    """`script` as one command line that any login shell (bash, zsh, fish, csh) hands to sh."""
    return shlex.join(["sh", "-c", script])


def agent_command(python: str, workdir: str, env: Mapping[str, str], args: Sequence[str] = ()) -> str:
    """The command line that starts the host agent: in `workdir` (exit NO_WORKDIR if it is
    missing), under `python` (exit NO_PYTHON if it is missing), with `env` (the launcher's
    PYTHONPATH and such: never a secret) added to the login environment."""
    q = shlex.quote
    program = (["env", *(f"{k}={v}" for k, v in env.items())] if env else []) + \
        [python, "-m", AGENT_MODULE, *args]
    script = (f"cd -- {q(workdir)} 2>/dev/null || {{ echo {q(f'no directory {workdir}')} >&2; exit {NO_WORKDIR}; }}; "
              f"test -x {q(python)} || {{ echo {q(f'no interpreter {python}')} >&2; exit {NO_PYTHON}; }}; "
              f"exec {shlex.join(program)}")
    return sh_command(script)


def agent_args(heartbeat: Optional[float] = None) -> list[str]:
    """The agent's own flags for a connection held for a job."""
    return ["--heartbeat", f"{heartbeat:g}"] if heartbeat else []
