"""The ssh side of the test hosts: keys, each host's sshd_config, and the run's client files.

Pure file writers plus `keygen`; nothing here starts a process except ssh-keygen (bounded).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.multihost import procs

SSHD = "/usr/sbin/sshd"
CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class SshHostEntry:
    """One test host as the client sees it: its alias, its address, its public host key line."""

    alias: str
    address: str
    host_public_key: str          # "ssh-ed25519 AAAA... comment"


def keygen(path: Path, comment: str) -> None:
    """Write a fresh passphrase-less ed25519 key pair to `path` and `path`.pub. Blocks (< 10 s)."""
    procs.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], timeout=10)


def write_sshd_config(path: Path, *, host_key: Path, authorized_keys: Path, pid_file: Path) -> None:
    """An sshd_config for one test host: key login as root only, no PAM, nothing read from /etc/ssh."""
    path.write_text(f"""\
# sshd of one shoal multi-host test host (tests/multihost); started inside the host's netns
Port 22
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PidFile {pid_file}
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PrintMotd no
X11Forwarding no
# launchers open one connection per task, many at once
MaxStartups 100
MaxSessions 100
# as a stock Debian sshd: only the locale crosses; a launcher must not rely on SendEnv
AcceptEnv LANG LC_*
Subsystem sftp internal-sftp
""")


def write_known_hosts(path: Path, entries: list[SshHostEntry]) -> None:
    """known_hosts with every test host's real key, under its alias and its address."""
    path.write_text("".join(f"{e.alias},{e.address} {e.host_public_key}\n" for e in entries))


def write_ssh_config(path: Path, entries: list[SshHostEntry], *, identity: Path, known_hosts: Path) -> None:
    """The run's ssh_config: one self-contained Host block per test host, as in a user's ~/.ssh/config.

    `ssh -F <path> host1 CMD` then works with nothing else configured; each block could be pasted
    into ~/.ssh/config as is.
    """
    blocks = [f"""\
Host {e.alias}
    HostName {e.address}
    Port 22
    User root
    IdentityFile {identity}
    IdentitiesOnly yes
    UserKnownHostsFile {known_hosts}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking accept-new
    BatchMode yes
    ConnectTimeout {CONNECT_TIMEOUT_S}
    LogLevel ERROR
""" for e in entries]
    path.write_text("# ssh_config of one shoal multi-host test run: ssh -F <this file> host1 ...\n\n"
                    + "\n".join(blocks))
