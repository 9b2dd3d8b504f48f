"""One test host: a network namespace joined to the run's bridge by a veth pair, with its own sshd.

A Host is made and owned by a HostNetwork (network.py); tests use its methods. None of them is
thread-safe; each blocks only for the bounded time its docstring names.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.multihost import procs, registry


@dataclass
class Host:
    """A test host.

    name:    its alias in the run's ssh_config (`ssh -F <ssh_config> host1 ...`).
    address: its IPv4 address on the run's /24 (the bridge holds .1).
    netns:   the network namespace (`ip netns exec <netns> ...`).
    veth:    the root-namespace end of its veth pair (on the bridge); `eth0` inside the host.
    """

    name: str
    address: str
    netns: str
    veth: str
    workdir: Path
    sshd: subprocess.Popen | None = None
    _procs: list[subprocess.Popen] = field(default_factory=list, repr=False)

    @property
    def sshd_pid(self) -> int:
        assert self.sshd is not None
        return self.sshd.pid

    def in_netns(self, argv: list[str]) -> list[str]:
        """argv that runs `argv` inside this host's namespace (same filesystem, same PID namespace)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: list[str], *, timeout: float = 30, check: bool = True,
            **kwargs) -> subprocess.CompletedProcess:
        """Run argv inside the host and wait (at most `timeout` s, else TimeoutExpired); text output captured."""
        return subprocess.run(self.in_netns(argv), capture_output=True, text=True, timeout=timeout,
                              check=check, **kwargs)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start argv inside the host in its own session; does not block. Killed at the test's end."""
        proc = subprocess.Popen(self.in_netns(argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        return proc

    def pids(self, include_sshd: bool = True) -> list[int]:
        """The PIDs of every process in the host (`ip netns pids`), sorted; blocks < 10 s."""
        out = procs.run(["ip", "netns", "pids", self.netns], timeout=10).stdout
        pids = sorted(int(p) for p in out.split())
        return pids if include_sshd else [p for p in pids if p != self.sshd_pid]

    def link_down(self) -> None:
        """Take the host off the bridge: it vanishes without closing its connections (no FIN, no RST)."""
        procs.run(["ip", "link", "set", self.veth, "down"], timeout=10)

    def link_up(self) -> None:
        """Put the host back on the bridge. Idempotent."""
        procs.run(["ip", "link", "set", self.veth, "up"], timeout=10)

    def shape(self, rate: str, burst: str = "256kb", latency: str = "10ms") -> None:
        """Limit the host's bandwidth to `rate` (tc units: "1gbit", "200mbit") both ways, with tbf.

        Egress of the bridge-side veth shapes what the host receives; egress of its eth0, what it
        sends. Replaces an earlier shape. (netem is not available on these kernels.)
        """
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        procs.run(["tc", "qdisc", "replace", "dev", self.veth, *tbf], timeout=10)
        procs.run(["tc", "-n", self.netns, "qdisc", "replace", "dev", "eth0", *tbf], timeout=10)

    def unshape(self) -> None:
        """Remove the bandwidth limit. Idempotent."""
        for argv in (["tc", "qdisc", "del", "dev", self.veth, "root"],
                     ["tc", "-n", self.netns, "qdisc", "del", "dev", "eth0", "root"]):
            subprocess.run(argv, capture_output=True, timeout=10)

    def reset(self) -> None:
        """Undo what a test did: link up, no shaping, and no process left but sshd. Blocks < ~10 s."""
        self.link_up()
        self.unshape()
        for proc in self._procs:
            procs.stop(proc, grace=2)
        self._procs.clear()
        stray = [procs.identity(p) for p in self.pids(include_sshd=False)]
        procs.kill_pids([p for p in stray if p is not None], grace=2)

    def close(self) -> None:
        """Kill everything in the host (sshd too) and delete its namespace and veth. Idempotent."""
        for proc in self._procs:
            procs.stop(proc, grace=2)
        self._procs.clear()
        if self.sshd is not None:
            procs.stop(self.sshd, grace=2)
        registry.delete_netns(self.netns)
        subprocess.run(["ip", "link", "del", self.veth], capture_output=True, timeout=10)
