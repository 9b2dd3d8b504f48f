"""Moving a task whose host was lost to another host: the restart policy's "restart elsewhere".

When an SSH host vanishes (its agent missed `ssh.heartbeat_timeout` of heartbeats), each of its
tasks ends as failed with exit 255. With `restart: on-failure` and restarts left, a *worker*
among them is not held until its dead host answers again: it is replaced by a worker with a
fresh index on a connected host with a free slot, placed and started as `shoal scale` adds one
(its own TF_CONFIG; it joins the running job by its heartbeats, docs/elastic.md). The lost task
ends MOVED, an expected end; the replacement inherits its restart count plus one, so hosts that
keep vanishing still exhaust `max_restarts`.

Only non-primary workers move. Every task's TF_CONFIG names the ps tasks' addresses, so a ps
restarts where it was; the primary (chief:0, else worker:0) owns the checkpoints and the job's
end. When no connected host has a free slot, the task is restarted on its own host once that
answers again, as before. When the replacement cannot be started on the host it was placed on
(its agent refused, the program is missing there), it is placed again on another eligible host,
never one tried already; once none is left the job ends (START_FAILED), naming every host tried
and its error.

Pure functions; thread-safe.
"""

from __future__ import annotations

from typing import Sequence

from shoal.cluster import TaskId

MOVABLE_ROLES = frozenset({"worker"})


def movable(task: TaskId, primary: TaskId) -> bool:
    """Whether `task` may move to another host when its own is lost."""
    return task.job in MOVABLE_ROLES and task != primary


def moved_detail(exit_detail: str, lost_host: str, new_node: str, new_task: str) -> str:
    """The lost task's last state detail: "exit 255; host3 was lost: moved to host1 as worker:3"."""
    return f"{exit_detail}; {lost_host} was lost: moved to {new_node or 'another host'} as {new_task}"


def moved_note(lost_host: str, old_task: str, new_node: str, new_task: str, restart: int, max_restarts: int) -> str:
    """The launcher's line: "shoal | host3 was lost: worker:1 moves to host1 as worker:2 (restart 1/3)"."""
    return (f"shoal | {lost_host} was lost: {old_task} moves to {new_node or 'another host'} as {new_task}"
            f" (restart {restart}/{max_restarts})")


def unplaced_note(label: str, lost_host: str, why: str) -> str:
    """The launcher's line when a lost task cannot move: it will restart on its own host."""
    return (f"shoal | {label}: {lost_host} was lost and no other host can take it ({why}); it restarts on"
            f" {lost_host} once that answers again")


def retry_note(lost_host: str, new_task: str, node: str, why: str) -> str:
    """The launcher's line when a replacement could not start on `node` and another host is tried."""
    return f"shoal | {lost_host} was lost: {new_task} could not be started on {node} ({why}); trying another host"


def unstarted_detail(lost_host: str, new_task: str, tried: Sequence[tuple[str, str]], gave_up: bool = False) -> str:
    """Why the job ends when no host started a lost task's replacement: each host tried, with
    its error ("host3 was lost and its replacement worker:4 could not be started on any other
    host: host1 (...), host2 (...)")."""
    hosts = ", ".join(f"{node} ({why})" for node, why in tried)
    where = f"the {len(tried)} hosts tried (the most a move tries)" if gave_up else "any other host"
    return f"{lost_host} was lost and its replacement {new_task} could not be started on {where}: {hosts}"


__all__ = ["MOVABLE_ROLES", "movable", "moved_detail", "moved_note", "retry_note", "unplaced_note",
           "unstarted_detail"]
