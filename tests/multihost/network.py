"""HostNetwork: a bridge, a test /24 and the test hosts on it, plus the run's ssh client files.

Lifecycle: `HostNetwork()` does no I/O; `start()` makes the bridge, the keys and the (empty)
ssh files; `add_host()` makes one more host with a running sshd; `close()` deletes everything
(idempotent, also after a half-done start). Not thread-safe. Needs root.
"""

from __future__ import annotations

import ipaddress
import json
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.multihost import procs, registry, sshd
from tests.multihost.host import Host

# 10.213.X.0/24, X picked per run among the ones no interface or route of this machine touches.
SUBNET_POOL = ipaddress.ip_network("10.213.0.0/16")
SSHD_START_TIMEOUT_S = 15


def _used_networks(exclude_dev: str = "") -> list[ipaddress.IPv4Network]:
    """Networks of every IPv4 address and route on this machine, except those on `exclude_dev`."""
    used = []
    addrs = json.loads(procs.run(["ip", "-j", "-4", "addr", "show"], timeout=10).stdout or "[]")
    routes = json.loads(procs.run(["ip", "-j", "-4", "route", "show", "table", "all"], timeout=10).stdout or "[]")
    texts = [f"{a['local']}/{a['prefixlen']}" for item in addrs if item.get("ifname") != exclude_dev
             for a in item.get("addr_info", []) if "local" in a]
    texts += [r["dst"] for r in routes if r.get("dev") != exclude_dev and r.get("dst") not in (None, "default")]
    for text in texts:
        try:
            used.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            continue
    return used


class HostNetwork:
    """The hosts of one test run and how to reach them with ssh."""

    def __init__(self) -> None:
        self.record: registry.RunRecord | None = None
        self.workdir: Path | None = None
        self.bridge = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self.hosts: list[Host] = []
        self._ssh_entries: list[sshd.SshHostEntry] = []
        self._closed = False

    # The run's ssh client files (valid after start()).
    @property
    def ssh_config(self) -> Path:
        """`ssh -F <this> host1 ...` reaches host1 as root with the run's key; see sshd.write_ssh_config."""
        assert self.workdir is not None
        return self.workdir / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "known_hosts"

    @property
    def identity(self) -> Path:
        """The run's private user key (its public half is authorized on every host)."""
        assert self.workdir is not None
        return self.workdir / "id_ed25519"

    @property
    def bridge_address(self) -> str:
        """The bridge's own address: the root namespace reaches every host through it."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def ssh_argv(self, host: Host, *command: str) -> list[str]:
        """argv that runs `command` on `host` over ssh with the run's ssh_config."""
        return ["ssh", "-F", str(self.ssh_config), host.name, *command]

    def start(self) -> None:
        """Clean stale runs, then make the record, work dir, keys and bridge. Blocks (< ~20 s)."""
        registry.clean_stale()
        self.record = registry.RunRecord.create()
        self.workdir = Path(tempfile.mkdtemp(prefix=self.record.name("-hosts-")))
        self.record.add("dirs", str(self.workdir))
        sshd.keygen(self.identity, f"shoal-test-{self.record.token}")
        (self.workdir / "authorized_keys").write_text(self.identity.with_suffix(".pub").read_text())
        self._write_client_files()
        self.bridge = self.record.name("br")
        self.record.add("links", self.bridge)
        procs.run(["ip", "link", "add", self.bridge, "type", "bridge"], timeout=10)
        self.subnet = self._claim_subnet()
        procs.run(["ip", "link", "set", self.bridge, "up"], timeout=10)

    def _claim_subnet(self) -> ipaddress.IPv4Network:
        """Give the bridge .1 of a free /24 of SUBNET_POOL; retried if another run took it meanwhile."""
        candidates = list(SUBNET_POOL.subnets(new_prefix=24))
        random.shuffle(candidates)
        for net in candidates[:20]:
            if any(net.overlaps(u) for u in _used_networks()):
                continue
            procs.run(["ip", "addr", "add", f"{net.network_address + 1}/24", "dev", self.bridge], timeout=10)
            # A concurrent run may have picked the same /24 between our check and our add.
            if not any(net.overlaps(u) for u in _used_networks(exclude_dev=self.bridge)):
                return net
            procs.run(["ip", "addr", "flush", "dev", self.bridge], timeout=10)
        raise procs.FixtureError(f"no free /24 in {SUBNET_POOL} after 20 tries; delete unused interfaces")

    def add_host(self) -> Host:
        """Make the next host (host1, host2, ...) with a running sshd; blocks until sshd accepts (< 15 s)."""
        assert self.record is not None and self.subnet is not None and self.workdir is not None, "start() first"
        index = len(self.hosts) + 1
        name = f"host{index}"
        host = Host(name=name, address=str(self.subnet.network_address + 1 + index),
                    netns=self.record.name(f"-{name}"), veth=self.record.name(f"v{index}"),
                    workdir=self.workdir / name)
        self.record.add("netns", host.netns)
        self.record.add("links", host.veth)
        self.hosts.append(host)
        procs.run(["ip", "netns", "add", host.netns], timeout=10)
        procs.run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns],
                  timeout=10)
        procs.run(["ip", "link", "set", host.veth, "master", self.bridge, "up"], timeout=10)
        procs.run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"], timeout=10)
        procs.run(["ip", "-n", host.netns, "link", "set", "eth0", "up"], timeout=10)
        procs.run(["ip", "-n", host.netns, "link", "set", "lo", "up"], timeout=10)
        self._start_sshd(host)
        return host

    def _start_sshd(self, host: Host) -> None:
        host.workdir.mkdir()
        host_key = host.workdir / "ssh_host_ed25519_key"
        sshd.keygen(host_key, f"{host.name}-{self.record.token}")
        config = host.workdir / "sshd_config"
        sshd.write_sshd_config(config, host_key=host_key, authorized_keys=self.workdir / "authorized_keys",
                               pid_file=host.workdir / "sshd.pid")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        log = host.workdir / "sshd.log"
        host.sshd = procs.start_daemon(host.in_netns([sshd.SSHD, "-D", "-f", str(config), "-E", str(log)]),
                                       host.workdir / "sshd.out")
        ident = procs.identity(host.sshd.pid)
        if ident is not None:
            self.record.add("pids", ident)
        procs.wait_until(lambda: host.sshd.poll() is not None or procs.tcp_open(host.address, 22),
                         timeout=SSHD_START_TIMEOUT_S, what=f"sshd of {host.name} accepting on {host.address}:22",
                         detail=lambda: _tail(log) + _tail(host.workdir / "sshd.out"))
        if host.sshd.poll() is not None:
            raise procs.FixtureError(f"sshd of {host.name} exited {host.sshd.returncode}:\n"
                                   f"{_tail(log)}{_tail(host.workdir / 'sshd.out')}")
        self._ssh_entries.append(sshd.SshHostEntry(host.name, host.address,
                                                   host_key.with_suffix(".pub").read_text().strip()))
        self._write_client_files()

    def _write_client_files(self) -> None:
        sshd.write_known_hosts(self.known_hosts, self._ssh_entries)
        sshd.write_ssh_config(self.ssh_config, self._ssh_entries, identity=self.identity,
                              known_hosts=self.known_hosts)

    def reset(self) -> None:
        """Undo what a test did to the hosts (links up, no shaping, only sshd left running)."""
        for host in self.hosts:
            host.reset()

    def close(self) -> None:
        """Delete every host, the bridge, the work dir and the run's record. Idempotent; blocks < ~30 s."""
        if self._closed:
            return
        self._closed = True
        for host in self.hosts:
            host.close()
        if self.record is not None:
            self.record.clean()
        elif self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return f"--- {path}:\n{text[-chars:]}\n" if text else ""


def netns_exists(name: str) -> bool:
    """Whether a network namespace of this name exists now."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return any(line.split()[0] == name for line in out.splitlines() if line.strip())
