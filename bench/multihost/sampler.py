"""What multihost_throughput samples during a run: the bytes on every host's link, and CPU.

    link bytes   per host, the root-namespace end of its veth pair: `tx_bytes` is what the host
                 received ("in"), `rx_bytes` what it sent ("out") (/sys/class/net/<veth>/statistics),
                 every PERIOD_S, as (monotonic time, bytes so far) series.
    tbf bytes    what each link's tbf qdisc counted itself (`tc -s qdisc`: the veth's egress
                 shapes "in", the host's eth0 egress "out"), read at the run's start and end only
                 (a `tc` process per read is too dear to sample). tbf counts a GSO packet as the
                 segments it will be on the wire (headers of every segment), so it counts ~4.5%
                 more than the interface counters for bulk TCP; `tbf_factor` (tbf / interface
                 bytes over the run, per link and direction) turns windowed interface bytes
                 into the bytes the shaper limits.
    CPU          the machine's busy CPU seconds, and user + system seconds of each process of
                 the run (found in the hosts' network namespaces through /proc/<pid>/ns/net, and
                 in the launcher's process tree), grouped by role: ps, worker, agent (the
                 launcher's host agents), sshd, launcher (shoal and its ssh clients), other.

Everything is sampled in one daemon thread from `start()` to `close()` (idempotent, safe in
`finally`); read the series after `close()`. The constructor does no I/O.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field

import psutil

from bench.usage import machine_busy_cpu_s

PERIOD_S = 0.05
DISCOVER_EVERY_S = 0.5
DIRECTIONS = ("in", "out")

Series = list[tuple[float, float]]


@dataclass(frozen=True)
class Link:
    """One host's link: the host's name, its veth (root namespace end) and its network namespace."""

    host: str
    veth: str
    netns: str


@dataclass
class Sampled:
    """What one run's sampler saw (series of (monotonic time, value so far))."""

    link_bytes: dict[tuple[str, str], Series] = field(default_factory=dict)  # (host, direction)
    tbf_bytes: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (start, end)
    iface_bytes: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # at the tbf reads
    machine_cpu: Series = field(default_factory=list)
    process_cpu: dict[int, Series] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)


def role_of(proc: psutil.Process) -> str | None:
    """ps / worker / agent / sshd / launcher / other, from a process's command line and
    environment; None when the process cannot be read (gone)."""
    try:
        cmdline = proc.cmdline()
        text = " ".join(cmdline)
        if "shoal.launch.agent" in text:
            return "agent"
        if cmdline and os.path.basename(cmdline[0]).startswith("sshd"):
            return "sshd"
        if "shoal.cli.main" in text or (cmdline and os.path.basename(cmdline[0]) == "ssh"):
            return "launcher"
        env = proc.environ()
    except psutil.Error:
        return None
    if "TF_CONFIG" in env:
        try:
            job = json.loads(env["TF_CONFIG"])["task"]["type"]
        except (ValueError, KeyError, TypeError):
            return "other"
        return "ps" if job == "ps" else "worker"
    if "RANK" in env and "WORLD_SIZE" in env:  # torch.distributed (the DDP peer)
        return "worker"
    return "other"


def _netns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


def _read_counter(veth: str, counter: str) -> int:
    with open(f"/sys/class/net/{veth}/statistics/{counter}") as f:
        return int(f.read())


def _iface_bytes(link: Link, direction: str) -> int:
    return _read_counter(link.veth, "tx_bytes" if direction == "in" else "rx_bytes")


def tbf_bytes(link: Link) -> dict[str, int]:
    """Bytes each of the link's two qdiscs has sent ({} for an unshaped link). Blocks (two `tc`)."""
    out = {}
    for direction, argv in (("in", ["tc", "-s", "-j", "qdisc", "show", "dev", link.veth]),
                            ("out", ["tc", "-n", link.netns, "-s", "-j", "qdisc", "show", "dev", "eth0"])):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        for qdisc in json.loads(done.stdout or "[]"):
            if qdisc.get("kind") == "tbf" and qdisc.get("root", True):
                out[direction] = int(qdisc["bytes"])
    return out


class RunSampler:
    """Samples `links` and the CPU of the run's processes (see the module docstring).
    `roots` are processes whose whole tree belongs to the run (the launcher); processes inside
    the links' namespaces belong to it too. Not thread-safe apart from start/close."""

    def __init__(self, links: list[Link], roots: list[int] = (), period_s: float = PERIOD_S) -> None:
        self.links = list(links)
        self.roots = list(roots)
        self.period_s = period_s
        self.sampled = Sampled()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add_root(self, pid: int) -> None:
        self.roots.append(pid)

    def start(self) -> None:
        """Read the tbf counters, then sample in the background. Blocks for the `tc` reads."""
        for link in self.links:
            for direction, value in tbf_bytes(link).items():
                self.sampled.tbf_bytes[(link.host, direction)] = (value, value)
                iface = _iface_bytes(link, direction)
                self.sampled.iface_bytes[(link.host, direction)] = (iface, iface)
        self._thread = threading.Thread(target=self._run, name="bench-multihost-sampler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop sampling, then read the tbf counters once more. Idempotent; blocks < a few s."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for link in self.links:
            for direction, value in tbf_bytes(link).items():
                key = (link.host, direction)
                iface = _iface_bytes(link, direction)
                if key in self.sampled.tbf_bytes:
                    self.sampled.tbf_bytes[key] = (self.sampled.tbf_bytes[key][0], value)
                    self.sampled.iface_bytes[key] = (self.sampled.iface_bytes[key][0], iface)

    def _discover(self, handles: dict[int, psutil.Process]) -> None:
        inodes = {}
        for link in self.links:
            try:
                inodes[_netns_inode(link.netns)] = link.host
            except OSError:
                continue
        found: list[psutil.Process] = []
        for pid in psutil.pids():
            if pid in handles:
                continue
            try:
                ns = os.readlink(f"/proc/{pid}/ns/net")  # "net:[4026532...]"
            except OSError:
                continue
            if int(ns[5:-1]) in inodes:
                try:
                    found.append(psutil.Process(pid))
                except psutil.Error:
                    continue
        for root in self.roots:
            try:
                top = psutil.Process(root)
                found += [top, *top.children(recursive=True)]
            except psutil.Error:
                continue
        for proc in found:
            if proc.pid not in handles:
                handles[proc.pid] = proc
                self.sampled.process_cpu[proc.pid] = []
        # Every pass: a process found between its fork and its exec showed its parent's
        # command line then.
        for pid, proc in handles.items():
            role = role_of(proc)
            if role is not None:
                self.sampled.roles[pid] = role
            else:
                self.sampled.roles.setdefault(pid, "other")

    def _run(self) -> None:
        handles: dict[int, psutil.Process] = {}
        series = {(link.host, d): [] for link in self.links for d in DIRECTIONS}
        self.sampled.link_bytes = series
        next_discovery = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_discovery:
                self._discover(handles)
                next_discovery = now + DISCOVER_EVERY_S
            self.sampled.machine_cpu.append((now, machine_busy_cpu_s()))
            for link in self.links:
                try:
                    series[(link.host, "in")].append((now, _read_counter(link.veth, "tx_bytes")))
                    series[(link.host, "out")].append((now, _read_counter(link.veth, "rx_bytes")))
                except OSError:
                    continue
            for pid, proc in list(handles.items()):
                try:
                    times = proc.cpu_times()
                except psutil.Error:
                    del handles[pid]
                    continue
                self.sampled.process_cpu[pid].append((now, times.user + times.system))
            self._stop.wait(self.period_s)
