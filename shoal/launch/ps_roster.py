"""`PsRoster`: the job's parameter servers as the launcher knows them now, and `with_roster`,
which gives a task that starts now the whole list in its TF_CONFIG.

The roster lists every ps that ever ran in the job, by index. `shoal scale JOB ps=N` adds a
ps with the index one above the highest that ever ran, and a ps is never scaled down nor
moved to another host (scaling.py, relocation.py), so the indices are 0..n-1 with no gap and
`cluster.ps` is a plain list: a new ps finds its own address at its index, and
len(cluster.ps) is its index + 1.

The supervisor holds the one roster of a job. Every task it starts — a ps it adds, a worker
it adds, any task it restarts — gets the roster's `cluster.ps` (`added_task` takes it,
`with_roster` updates the TF_CONFIG a task was planned with); tasks already running keep the
TF_CONFIG they started with (the ps runtime tells them of a new ps, not the launcher).

Pure data and functions; thread-safe (immutable).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from shoal.cluster import ClusterConfig, ClusterError, ClusterSpec, TaskId, parse_tf_config
from shoal.launch.errors import PlanError
from shoal.launch.plan import TaskPlan


@dataclass(frozen=True)
class PsRoster:
    """The address of every ps that ever ran in a job; item i is ps:i."""

    addresses: tuple[str, ...] = ()

    @classmethod
    def of_tasks(cls, tasks: Iterable[TaskPlan]) -> "PsRoster":
        """The roster of a job planned with `tasks` (its ps tasks must be ps:0..ps:n-1)."""
        ps = sorted((t.task.index, t.address) for t in tasks if t.task.job == "ps")
        indices = [index for index, _ in ps]
        if indices != list(range(len(ps))):
            raise PlanError(f"the job's ps tasks have indices {indices}; a job starts with ps:0 to"
                            f" ps:{len(ps) - 1}, with no gap")
        return cls(tuple(address for _, address in ps))

    def added(self, task: TaskId, address: str) -> "PsRoster":
        """This roster with `task` (the next ps, ps:len(addresses)) at `address`; PlanError
        for any other task, naming it."""
        if task.job != "ps" or task.index != len(self.addresses):
            raise PlanError(f"{task} cannot join the ps list {list(self.addresses)}: the next ps is"
                            f" ps:{len(self.addresses)} (a ps gets the index above every one that ran)")
        return PsRoster((*self.addresses, address))


def with_roster(task: TaskPlan, roster: PsRoster) -> TaskPlan:
    """`task` with `cluster.ps` of its TF_CONFIG set to `roster`, when the launcher planned it
    with fewer ps (its list a proper prefix of the roster's); else `task` itself (up to date,
    or a TF_CONFIG the spec sets, which is the user's)."""
    env = task.env_dict
    text = env.get("TF_CONFIG")
    if text is None:
        return task
    try:
        config = parse_tf_config(text)
    except ClusterError:
        return task  # not one the launcher rendered
    ps = tuple(config.ps_addresses)
    if config.cluster.task_indices("ps") != tuple(range(len(ps))) or len(ps) >= len(roster.addresses) \
            or roster.addresses[:len(ps)] != ps:
        return task
    cluster = ClusterSpec.from_dict({**config.cluster.as_dict(), "ps": list(roster.addresses)})
    env["TF_CONFIG"] = ClusterConfig(cluster, config.task).to_tf_config()
    return replace(task, env=tuple((key, env[key]) for key, _ in task.env))


__all__ = ["PsRoster", "with_roster"]
