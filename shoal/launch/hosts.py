"""The hosts a job runs on, and which task goes to which host.

Hosts come from the spec (`hosts:`), `--hosts a,b,c` or `--hostfile FILE` (DeepSpeed's format:
one `host slots=N` per line, `#` comments). A host is an ssh destination (`node1`,
`user@10.0.0.2`, an alias of `~/.ssh/config`); `slots` caps how many training tasks (chief,
workers, evaluator) it takes, unlimited when not given.

Placement (`place_tasks`): parameter servers are spread over the hosts first, one per host in
order (wrapping around); then each training task goes to the host with the fewest tasks so far
that has a free slot (the first such host on a tie), so workers land apart from the ps tasks
when there is room. A role's own `hosts:` pins its tasks to those hosts.

A task added to a running job (`shoal scale`, a worker moved off a lost host) goes to the
connected host with the fewest tasks now (the first such host on a tie, `host_for_added`); a
training task needs a free slot there, a ps does not (slots count training tasks only). Pure:
no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Optional

from shoal.cluster import TaskId
from shoal.launch.errors import PlanError, SpecError

LOCALHOST = "localhost"
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9_.-]+@)?(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])$")
_SLOTS_RE = re.compile(r"^slots=(\d+)$")


@dataclass(frozen=True)
class Host:
    """One host of a job: its ssh destination and how many training tasks it takes (None:
    no limit)."""

    name: str
    slots: Optional[int] = None


def is_local(hosts: Sequence[Host]) -> bool:
    """Whether the job runs on this machine only: no hosts, or the one host `localhost`."""
    return not hosts or [h.name for h in hosts] == [LOCALHOST]


def refuse_pins_off_this_machine(pinned: Mapping[str, Sequence[str]]) -> None:
    """PlanError when a job that runs on this machine only (`is_local`) pins a role to another
    host: it would run here, not where the spec says. Does not block."""
    for role, names in pinned.items():
        away = [n for n in names if n != LOCALHOST]
        if away:
            raise PlanError(f"roles.{role}.hosts names {', '.join(map(repr, away))}, but the job runs on this "
                            f"machine only (its hosts: none, or localhost alone); list them among the job's hosts "
                            f"(hosts:, --hosts or --hostfile) to run there over ssh, or drop roles.{role}.hosts")


def host_name_problem(name: object) -> Optional[str]:
    """Why `name` cannot be an ssh destination, or None if it can."""
    if not isinstance(name, str) or not _HOST_RE.match(name) or name.startswith("-"):
        return f"{name!r} is not a host name; write e.g. node1, user@10.0.0.2 or an alias of ~/.ssh/config"
    return None


def check_host_name(name: str, where: str) -> str:
    """`name` if it can be an ssh destination; SpecError naming `where` otherwise."""
    problem = host_name_problem(name)
    if problem:
        raise SpecError(problem, source=where)
    return name


def parse_hosts_flag(text: str) -> tuple[Host, ...]:
    """`--hosts a,b,c` (optionally `a:4` for 4 slots)."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, slots = item.rpartition(":") if re.search(r":\d+$", item) and "[" not in item else (item, "", "")
        hosts.append(Host(check_host_name(name, "--hosts"), int(slots) if sep else None))
    return _unique(hosts, "--hosts")


def parse_hostfile(text: str, source: str) -> tuple[Host, ...]:
    """A hostfile: `host [slots=N]` per line; blank lines and `#` comments are skipped."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *rest = line.split()
        slots = None
        for word in rest:
            match = _SLOTS_RE.match(word)
            if match is None:
                raise SpecError(f"line {number}: {word!r} is not slots=N; write e.g. `node1 slots=4`", source=source)
            slots = int(match.group(1))
        hosts.append(Host(check_host_name(name, f"{source}, line {number}"), slots))
    if not hosts:
        raise SpecError("the hostfile lists no hosts; write one `host slots=N` per line", source=source)
    return _unique(hosts, source)


def _unique(hosts: Iterable[Host], where: str) -> tuple[Host, ...]:
    seen: dict[str, Host] = {}
    for host in hosts:
        if host.name in seen:
            raise SpecError(f"host {host.name!r} is listed twice; list each host once (use slots=N for more "
                            "tasks on it)", source=where)
        if host.slots is not None and host.slots < 1:
            raise SpecError(f"host {host.name!r} has slots={host.slots}; give it at least 1", source=where)
        seen[host.name] = host
    return tuple(seen.values())


def place_tasks(tasks: Sequence[TaskId], hosts: Sequence[Host],
                pinned: Mapping[str, Sequence[str]] | None = None) -> dict[TaskId, Host]:
    """Which host each task runs on (see the module docstring). `pinned` maps a role to the
    names of the hosts its tasks may use. PlanError when the slots do not suffice."""
    if not hosts:
        raise PlanError("the job has no hosts to run on; list them with hosts:, --hosts or --hostfile")
    by_name = {h.name: h for h in hosts}
    pinned = dict(pinned or {})
    for role, names in pinned.items():
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise PlanError(f"roles.{role}.hosts names {', '.join(map(repr, unknown))}, which the job's hosts "
                            f"({', '.join(by_name)}) do not list; add them to hosts: or fix roles.{role}.hosts")
    load = {h.name: 0 for h in hosts}
    used_slots = {h.name: 0 for h in hosts}
    out: dict[TaskId, Host] = {}
    next_ps: dict[str, int] = {}
    for task in tasks:
        allowed = [by_name[n] for n in pinned.get(task.job, ())] or list(hosts)
        if task.job == "ps":
            key = ",".join(h.name for h in allowed)
            host = allowed[next_ps.get(key, 0) % len(allowed)]
            next_ps[key] = next_ps.get(key, 0) + 1
        else:
            free = [h for h in allowed if h.slots is None or used_slots[h.name] < h.slots]
            if not free:
                wanted = sum(1 for t in tasks if t.job != "ps")
                raise PlanError(f"{task} has no free slot on {', '.join(h.name for h in allowed)} "
                                f"({wanted} training tasks in all); raise slots= in the hostfile or add hosts")
            host = min(free, key=lambda h: load[h.name])  # min keeps the first on a tie
            used_slots[host.name] += 1
        load[host.name] += 1
        out[task] = host
    return out


def host_for_added(task: TaskId, hosts: Sequence[Host], connected: Iterable[str],
                   placed: Iterable[tuple[str, str]]) -> Host:
    """The host a task added to a running job goes to (see the module docstring): among
    `hosts` whose names are in `connected`, given `placed`, the (host name, role) of each task
    that holds its place now. PlanError naming the hosts when none can take it."""
    connected, placed = set(connected), list(placed)
    load = {h.name: sum(node == h.name for node, _ in placed) for h in hosts}
    training = {h.name: sum(node == h.name and role != "ps" for node, role in placed) for h in hosts}
    free = [h for h in hosts if h.name in connected
            and (task.job == "ps" or h.slots is None or training[h.name] < h.slots)]
    if not free:
        if task.job == "ps" or not connected:
            raise PlanError(f"{task} has no host to run on: no host of the job is connected"
                            f" ({', '.join(h.name for h in hosts)}); shoal status shows the lost ones")
        raise PlanError(f"{task} has no host to run on: every connected host of the job"
                        f" ({', '.join(sorted(connected))}) has used its slots; raise slots= in the"
                        " hostfile, or scale down first")
    return min(free, key=lambda h: load[h.name])  # min keeps the first on a tie
