"""`shoal status`'s task table: what the DETAIL column adds to the PID column."""

from shoal.cli.cmd_status import detail_text
from shoal.launch.records import TaskRecord
from shoal.launch.states import TaskState


def _task(pid, detail):
    return TaskRecord("worker.0", "mnist.worker.0", "127.0.0.1:2222", TaskState.RUNNING, pid, 0, detail, "")


def test_detail_leaves_out_the_pid_the_pid_column_shows():
    assert detail_text(_task(4242, "pid 4242")) == ""
    assert detail_text(_task(4242, "pid 4242 on host1")) == "on host1"


def test_detail_keeps_what_is_not_the_tasks_own_pid():
    assert detail_text(_task(4242, "exit 143")) == "exit 143"
    assert detail_text(_task(4242, "pid 42421")) == "pid 42421"
    assert detail_text(_task(None, "pid 7 on host2")) == "pid 7 on host2"
