"""`PsRoster`: the job's parameter servers as the launcher knows them now.

The roster lists every ps that ever ran in the job, by index. `shoal scale JOB ps=N` adds a
ps with the index one above the highest that ever ran, and a ps is never scaled down nor
moved to another host (scaling.py, relocation.py), so the indices are 0..n-1 with no gap and
`cluster.ps` is a plain list: a new ps finds its own address at its index, and
len(cluster.ps) is its index + 1.

The supervisor holds the one roster of a job and gives it to a ps it adds (`added_task`).
Every other task keeps the ps list the job started with, also when it is restarted or added
later: the ps runtime tells the training tasks of a ps that joined (they replay the job's
placement history from the placement of the ps the job started with), so a worker that listed
the added ps would start from another placement.

Pure data and functions; thread-safe (immutable).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shoal.cluster import TaskId
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


__all__ = ["PsRoster"]
