"""On-disk records of what each multi-host test run created, and the removal of stale ones.

A run writes its record under RECORD_DIR *before* it creates anything, and adds to it as it goes.
Every name it creates carries the prefix `shoal` + the run's 6-hex token (network namespaces
`shoal<token>-host1`, links `shoal<token>br` / `shoal<token>v1`), so objects of a run that crashed
(killed by a timeout, `kill -9`, a lost machine) can be found and deleted by the next run:
a record whose owner process is gone is cleaned, and so is any object with our prefix whose token
has no record at all. Objects of runs that are still alive are never touched.

Not thread-safe: one RunRecord belongs to one fixture in one process.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from tests.multihost import procs

RECORD_DIR = Path("/run/shoal-tests")
PREFIX = "shoal"
_TOKEN = r"[0-9a-f]{6}"
NETNS_RE = re.compile(rf"^{PREFIX}({_TOKEN})-\w+$")
LINK_RE = re.compile(rf"^{PREFIX}({_TOKEN})(br|v\d+)$")


@dataclass
class RunRecord:
    """What one run created; `clean()` deletes all of it (processes first, then namespaces, links, dirs)."""

    token: str
    owner: tuple[int, float]                      # (pid, create_time) of the process that made the run
    pids: list[tuple[int, float]] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    slurm_confs: list[str] = field(default_factory=list)

    @classmethod
    def create(cls) -> RunRecord:
        """A new record with a fresh token, owned by this process, already on disk."""
        RECORD_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        while True:
            token = secrets.token_hex(3)
            if not (RECORD_DIR / f"{token}.json").exists() and not _objects_with_token(token):
                break
        owner = procs.identity(os.getpid())
        assert owner is not None
        record = cls(token, owner)
        record.save()
        return record

    @property
    def path(self) -> Path:
        return RECORD_DIR / f"{self.token}.json"

    def name(self, suffix: str) -> str:
        """A name for a new object of this run: the prefix, the token, then `suffix`."""
        return f"{PREFIX}{self.token}{suffix}"

    def save(self) -> None:
        """Write the record atomically (a reader sees the old or the new one, never half of it)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, self.path)

    def add(self, kind: str, value) -> None:
        """Note one more object of `kind` (a field name) and save, before the object is made."""
        getattr(self, kind).append(value)
        self.save()

    def owner_alive(self) -> bool:
        """Whether the process that made this run still runs (same PID and same start time)."""
        return _same(procs.identity(self.owner[0]), self.owner)

    def clean(self) -> None:
        """Delete every object of the record, then the record. Idempotent; blocks for a few seconds at most."""
        procs.kill_pids([tuple(p) for p in self.pids])
        # Processes the run did not start itself but caused (slurmstepd, job tasks, ssh sessions).
        procs.kill_pids(_processes_of(self.dirs, self.slurm_confs))
        for ns in self.netns:
            delete_netns(ns)
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=10)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.path.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> RunRecord | None:
        try:
            data = json.loads(path.read_text())
            data["owner"] = tuple(data["owner"])
            data["pids"] = [tuple(p) for p in data["pids"]]
            return cls(**data)
        except (OSError, ValueError, TypeError, KeyError):
            return None


def _same(a: tuple[int, float] | None, b: tuple[int, float]) -> bool:
    return a is not None and a[0] == b[0] and abs(a[1] - b[1]) < 0.01


def delete_netns(ns: str) -> None:
    """Kill every process in namespace `ns` (by PID), then delete it. Missing namespace: no-op."""
    listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    if listed.returncode != 0:
        return
    pids = [procs.identity(int(p)) for p in listed.stdout.split()]
    procs.kill_pids([p for p in pids if p is not None])
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _processes_of(dirs: list[str], slurm_confs: list[str]) -> list[tuple[int, float]]:
    """Processes holding a file or unix socket under one of `dirs` (daemons' logs, slurmstepd's
    spool socket), or whose environment names one of `slurm_confs` (a job's tasks)."""
    roots = tuple(os.path.join(d, "") for d in dirs)
    confs = set(slurm_confs)
    found = []
    for p in psutil.process_iter(["pid", "create_time"]):
        if p.info["pid"] == os.getpid():
            continue
        try:
            connections = getattr(p, "net_connections", None) or p.connections   # psutil < 6 lacks the former
            paths = [f.path for f in p.open_files()] + [c.laddr for c in connections(kind="unix")
                                                        if isinstance(c.laddr, str)]
            if (roots and any(path.startswith(roots) for path in paths)) \
                    or (confs and p.environ().get("SLURM_CONF") in confs):
                found.append((p.info["pid"], p.info["create_time"]))
        except psutil.Error:
            continue
    return found


def _netns_names() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=10).stdout
    # "7: shoal1a2b3cv1@if2: <...": the name ends at '@' or ':'
    return [re.split(r"[@:]", line.split(": ", 1)[1], maxsplit=1)[0] for line in out.splitlines() if ": " in line]


def _objects_with_token(token: str) -> bool:
    return any((m := NETNS_RE.match(n)) and m.group(1) == token for n in _netns_names()) or \
        any((m := LINK_RE.match(n)) and m.group(1) == token for n in _link_names())


def clean_stale() -> list[str]:
    """Delete the objects of every earlier run whose owner is gone; returns their tokens.

    Records of living owners are left alone; objects with our prefix but no record are orphans
    of a crash and are deleted too. Blocks for a few seconds at most per stale run.
    """
    live_tokens: set[str] = set()
    cleaned: list[str] = []
    if RECORD_DIR.is_dir():
        for path in sorted(RECORD_DIR.glob("*.json")):
            record = RunRecord.load(path)
            if record is None:
                continue
            if record.owner_alive():
                live_tokens.add(record.token)
            else:
                record.clean()
                cleaned.append(record.token)
    orphans: dict[str, RunRecord] = {}

    def orphan(token: str) -> RunRecord | None:
        if token in live_tokens or (RECORD_DIR / f"{token}.json").exists():
            return None
        return orphans.setdefault(token, RunRecord(token, (0, 0.0)))

    for ns in _netns_names():
        if (m := NETNS_RE.match(ns)) and (record := orphan(m.group(1))):
            record.netns.append(ns)
    for link in _link_names():
        if (m := LINK_RE.match(link)) and (record := orphan(m.group(1))):
            record.links.append(link)
    for token, record in orphans.items():
        record.clean()
        cleaned.append(token)
    return cleaned
