"""The progress watchdog: its blame rules on an injected clock, and the Supervisor applying
its actions with the fake executor of test_launch_supervisor (no processes, no sockets)."""

import io
import signal
import threading

import pytest

from shoal.cli.exit_codes import job_exit_code
from shoal.launch.logmux import LogMux
from shoal.launch.progress_line import parse_waiting
from shoal.launch.spec import WatchdogAction, WatchdogSpec, spec_from_dict
from shoal.launch.states import JobState, TaskState
from shoal.launch.supervisor import EndReason, Supervisor
from shoal.launch.watchdog import Watchdog, checkpoint_interval, effective_stall
from tests.unit.test_launch_supervisor import FakeClock, FakeExecutor, Recorder, plan_of

pytestmark = pytest.mark.timeout(30)

WORKERS = ("chief.0", "worker.0", "worker.1")


def watchdog(clock, stall=10.0, training=WORKERS):
    return Watchdog(stall, WatchdogAction.FAIL, 3, training, clock)


# --- the rules -------------------------------------------------------------------------


def test_no_stall_before_the_first_progress_line_however_long():
    clock = FakeClock()
    dog = watchdog(clock)
    clock.now = 10_000
    assert dog.check(WORKERS) is None


def test_no_stall_while_the_step_advances_within_the_stall():
    clock = FakeClock()
    dog = watchdog(clock)
    for t in range(0, 100, 9):
        clock.now = t
        dog.progress("worker.0", t)
        assert dog.check(WORKERS) is None


def test_stall_names_the_task_whose_last_progress_is_the_oldest():
    clock = FakeClock()
    dog = watchdog(clock)
    for name in WORKERS:
        dog.progress(name, 1)
    clock.now = 5
    dog.progress("chief.0", 2)
    dog.progress("worker.0", 2)
    clock.now = 14
    assert dog.check(WORKERS) is None
    clock.now = 16
    stall = dog.check(WORKERS)
    assert (stall.step, stall.seconds, stall.stuck) == (2, 11, ("worker.1",))
    assert stall.describe() == ("no progress for 11s at step 2; stuck: worker.1 (its last"
                                " progress is the oldest)")


def test_stall_names_a_task_that_never_printed_before_the_others():
    clock = FakeClock()
    dog = watchdog(clock)
    dog.progress("chief.0", 3)
    clock.now = 2
    dog.progress("worker.0", 3)
    clock.now = 20
    stall = dog.check(WORKERS)
    assert stall.stuck == ("worker.1",) and "no progress line since it started" in stall.why


def test_stall_names_every_task_whose_last_progress_ties_for_the_oldest():
    clock = FakeClock()
    dog = watchdog(clock)
    dog.progress("chief.0", 3)
    clock.now = 0.5
    dog.progress("worker.0", 3)
    clock.now = 5
    dog.progress("worker.1", 4)
    clock.now = 20
    assert dog.check(WORKERS).stuck == ("chief.0", "worker.0")


def test_tasks_the_waiting_workers_name_are_blamed_first_even_a_ps():
    clock = FakeClock()
    dog = watchdog(clock)
    for name in WORKERS:
        dog.progress(name, 4)
    clock.now = 3
    dog.waiting("worker.0", ("ps.0",))
    dog.waiting("worker.0", ("worker.0",))  # never itself
    clock.now = 11
    stall = dog.check(WORKERS + ("ps.0",))
    assert stall.stuck == ("ps.0",) and "wait for it" in stall.why


def test_a_waiting_line_names_the_ps_that_does_not_answer_status_not_those_that_wait_on_it():
    # ps:0 answers 'status' but holds the push for a sync step that waits on ps:1: ps:1 is stopped
    line = (b"worker:0 waiting for ps:0 at 127.0.0.1:2222 to answer 'push', ps:1 at 127.0.0.1:2223 to answer"
            b" 'push' (ps:1 does not answer 'status' either) (16s of 120s)")
    assert parse_waiting(line) == ("ps.1",)
    assert parse_waiting(b"worker:0 waiting for ps:0 at h:1 to answer 'push', ps:1 at h:2 to answer 'push'"
                         b" (5s of 120s)") == ("ps.0", "ps.1")
    assert parse_waiting(b"worker:0 waiting for worker:1: ps:0: step 12 waits for worker:1 (5s of 120s)") == \
        ("worker.1",)


def test_only_running_tasks_are_blamed():
    clock = FakeClock()
    dog = watchdog(clock)
    dog.progress("chief.0", 1)
    clock.now = 20
    assert dog.check(("chief.0", "worker.0")).stuck == ("worker.0",)


def test_every_worker_printing_without_the_step_advancing_blames_them_all():
    clock = FakeClock()
    dog = watchdog(clock)
    dog.progress("chief.0", 7)
    for t in (4, 8, 12):
        clock.now = t
        for name in WORKERS:
            dog.progress(name, 7)
    assert dog.check(WORKERS).stuck == WORKERS


def test_a_slower_replica_printing_its_own_rising_steps_is_progress_after_the_fastest_finished():
    """A plain program prints each replica's own step: once the fastest replica is done the
    highest step stays, but the slower one's steps still rise: not a stall."""
    clock = FakeClock()
    dog = watchdog(clock, training=("worker.0", "worker.1"))
    dog.progress("worker.0", 19)  # its last line: it finished
    for t, step in ((6, 5), (12, 7), (18, 9), (24, 11)):
        clock.now = t
        dog.progress("worker.1", step)
        assert dog.check(("worker.1",)) is None
    clock.now = 36
    stall = dog.check(("worker.1",))
    assert (stall.step, stall.seconds, stall.stuck) == (19, 12, ("worker.1",))


def test_the_task_that_advanced_the_step_and_printed_nothing_since_is_blamed():
    clock = FakeClock()
    dog = watchdog(clock, training=("worker.0", "worker.1"))
    dog.progress("worker.0", 3)
    clock.now = 2
    dog.progress("worker.1", 4)  # the last advance; nothing from anyone since
    clock.now = 20
    stall = dog.check(("worker.1",))  # worker.0 has ended
    assert stall.stuck == ("worker.1",) and stall.why == "it printed the last step and nothing since"


def test_reset_forgetting_the_step_waits_for_a_first_progress_line_again():
    clock = FakeClock()
    dog = watchdog(clock)
    dog.progress("chief.0", 7)
    clock.now = 20
    assert dog.check(WORKERS) is not None
    dog.reset(forget_step=True)
    clock.now = 1000
    assert dog.check(WORKERS) is None


def test_default_stall_is_five_minutes_or_twice_the_checkpoint_interval():
    spec = WatchdogSpec()
    assert effective_stall(spec, ["python", "train.py"]) == 300
    assert effective_stall(spec, ["python", "t.py", "--checkpoint_every_secs", "600"]) == 1200
    assert effective_stall(spec, ["python", "t.py", "--checkpoint_every_secs=30"]) == 300
    assert effective_stall(WatchdogSpec(stall=3), ["t.py", "--checkpoint_every_secs=600"]) == 3
    assert checkpoint_interval(["t.py", "--checkpoint_every_secs", "soon"]) is None


@pytest.mark.parametrize("stall", ["off", 0, "0s"])
def test_stall_off_turns_the_watchdog_off(stall):
    spec = spec_from_dict({"name": "a", "run": "x", "roles": {"worker": {}},
                           "watchdog": {"stall": stall}})
    assert effective_stall(spec.watchdog, ["x"]) is None
    assert Watchdog.for_spec(spec.watchdog, [("worker.0", ("x",))], "worker.0", FakeClock()) is None


# --- the supervisor applies the action ------------------------------------------------------


class Job:
    """A Supervisor with a watchdog, run on a thread; the test moves the fake clock."""

    def __init__(self, tmp_path, action, *, max_restarts=3, ignore_term=False, grace="2s", **extra):
        self.clock = FakeClock()
        roles = {"chief": {}, "worker": {"count": 2}, "ps": {}}
        self.plan = plan_of(tmp_path, roles, grace_period=grace,
                            watchdog={"stall": "10s", "action": action, "max_restarts": max_restarts}, **extra)
        self.executor = FakeExecutor(self.clock, {}, ignore_term=ignore_term)
        self.recorder = Recorder(self.clock)
        self.dog = Watchdog.for_spec(self.plan.watchdog, [(t.name, t.argv) for t in self.plan.tasks],
                                     "chief.0", self.clock)
        self.out = io.BytesIO()
        self.supervisor = Supervisor(self.plan, executor=self.executor, mux=LogMux(self.out),
                                     observer=self.recorder, clock=self.clock, watchdog=self.dog)
        self.results: list = []
        self.thread = threading.Thread(target=lambda: self.results.append(self.supervisor.run()),
                                       daemon=True)

    def start(self):
        self.thread.start()
        wait_until(lambda: len(self.executor.starts) == 4 and all(
            self.recorder.final().get(t.name) is TaskState.RUNNING for t in self.plan.tasks))

    def stall_worker_1(self):
        """Every task prints step 1; chief and worker.0 then step 2; then 11 s pass."""
        for name in WORKERS:
            self.dog.progress(name, 1)
        self.clock.now = 5
        self.dog.progress("chief.0", 2)
        self.dog.progress("worker.0", 2)
        self.clock.now = 16

    def starts(self, name):
        return sum(n == name for n, _ in self.executor.starts)

    def stop(self):
        self.supervisor.request_stop("test over", force=True)
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.results[0]


def wait_until(condition, what="the condition"):
    for _ in range(400):  # bounded: 20 s
        if condition():
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_fail_action_ends_the_job_stalled_with_the_stuck_task_as_root_cause(tmp_path):
    job = Job(tmp_path, "fail")
    job.start()
    job.stall_worker_1()
    job.thread.join(10)
    [result] = job.results
    assert (result.state, result.reason, job_exit_code(result)) == (
        JobState.FAILED, EndReason.STALLED, 1)
    assert result.detail.startswith("watchdog: no progress for 11s at step 2; stuck: worker.1")
    assert result.failure.task == "worker.1" and "stopped by the watchdog" in result.failure.detail
    assert result.failure.log_path.endswith("worker.1.log")
    assert b"shoal | watchdog: no progress for 11s at step 2; stuck: worker.1" in job.out.getvalue()
    assert job.recorder.jobs[-1][0] is JobState.FAILED


def test_restart_stuck_restarts_only_the_stuck_task_with_its_identity(tmp_path):
    job = Job(tmp_path, "restart-stuck")
    job.start()
    job.stall_worker_1()
    wait_until(lambda: job.starts("worker.1") == 2, "worker.1 to start again")
    assert [job.starts(n) for n in ("ps.0", "chief.0", "worker.0")] == [1, 1, 1]
    old = [h for h in job.executor.handles if h.name == "worker.1"][0]
    assert old.signals == [signal.SIGTERM]
    details = [d for _, n, _, new, d in job.recorder.tasks if n == "worker.1" and new is TaskState.RESTARTING]
    assert details == ["killed by SIGTERM; restarted by the watchdog"]
    assert b"stuck: worker.1 (its last progress is the oldest); restarting worker.1" in job.out.getvalue()
    assert job.stop().reason is EndReason.STOPPED


def test_restart_stuck_after_every_ps_finished_fails_the_job_instead_of_restarting(tmp_path):
    job = Job(tmp_path, "restart-stuck")
    job.start()
    job.executor.handle("ps.0").exit(0)  # the ps saw the job's end: training is over
    wait_until(lambda: job.recorder.final().get("ps.0") is TaskState.SUCCEEDED, "ps.0 to succeed")
    job.stall_worker_1()
    job.thread.join(10)
    [result] = job.results
    assert (result.state, result.reason) == (JobState.FAILED, EndReason.STALLED)
    assert job.starts("worker.1") == 1
    assert (b"stuck: worker.1 (its last progress is the oldest); not restarted: training was over (every ps had"
            b" finished), so it would find no ps to train with; the job fails") in job.out.getvalue()


def test_restart_stuck_kills_a_task_that_ignores_sigterm_after_the_grace_period(tmp_path):
    job = Job(tmp_path, "restart-stuck", ignore_term=True, grace="2s")
    job.start()
    job.stall_worker_1()
    old = [h for h in job.executor.handles if h.name == "worker.1"][0]
    wait_until(lambda: old.signals == [signal.SIGTERM], "SIGTERM")
    assert job.starts("worker.1") == 1  # the grace period has not passed on the fake clock
    job.clock.now = 18.5
    wait_until(lambda: job.starts("worker.1") == 2, "worker.1 to start again")
    assert old.signals == [signal.SIGTERM, signal.SIGKILL]
    job.stop()


def test_restart_job_stops_and_starts_every_task_then_waits_for_progress_again(tmp_path):
    job = Job(tmp_path, "restart-job")
    job.start()
    job.stall_worker_1()
    wait_until(lambda: all(job.starts(t.name) == 2 for t in job.plan.tasks), "every task to start again")
    wait_until(lambda: all(job.recorder.final()[t.name] is TaskState.RUNNING for t in job.plan.tasks))
    assert all(h.signals == [signal.SIGTERM] for h in job.executor.handles[:4])
    assert b"restarting the job" in job.out.getvalue()
    job.clock.now = 1000  # no progress line since the restart: no stall
    assert job.dog.check(t.name for t in job.plan.tasks) is None
    assert job.stop().reason is EndReason.STOPPED


def test_restart_job_names_a_task_that_survives_sigkill_and_restarts_it_once_it_exits(tmp_path):
    job = Job(tmp_path, "restart-job")
    job.start()
    unkillable = job.executor.handle("worker.1")
    unkillable.signal = unkillable.signals.append  # as a process in uninterruptible I/O: no signal ends it
    job.stall_worker_1()
    wait_until(lambda: unkillable.signals == [signal.SIGTERM], "the job's restart to begin")
    job.clock.now = 18.5  # past the 2 s grace period: SIGKILL
    wait_until(lambda: unkillable.signals == [signal.SIGTERM, signal.SIGKILL], "SIGKILL")
    job.clock.now = 24  # past the 5 s SIGKILL wait
    wait_until(lambda: b"t.worker.1 did not exit within 5s of SIGKILL" in job.out.getvalue(), "the line naming it")
    assert job.starts("worker.1") == 1
    unkillable.exit(-signal.SIGKILL)
    wait_until(lambda: job.starts("worker.1") == 2, "worker.1 to start again once it exited")
    job.stop()


def test_a_stall_after_max_restarts_fails_the_job(tmp_path):
    job = Job(tmp_path, "restart-stuck", max_restarts=0)
    job.start()
    job.stall_worker_1()
    job.thread.join(10)
    [result] = job.results
    assert result.reason is EndReason.STALLED and job.starts("worker.1") == 1
    assert b"(watchdog.max_restarts), so the job fails" in job.out.getvalue()


def test_a_job_that_prints_no_progress_never_stalls(tmp_path):
    clock = FakeClock(tick=1.0)  # time flies: every reading is a second later
    plan = plan_of(tmp_path, {"worker": {}}, deadline="60s", watchdog={"stall": "2s"})
    dog = Watchdog.for_spec(plan.watchdog, [(t.name, t.argv) for t in plan.tasks], "worker.0", clock)
    supervisor = Supervisor(plan, executor=FakeExecutor(clock, {}), mux=LogMux(io.BytesIO()),
                            observer=Recorder(clock), clock=clock, watchdog=dog)
    assert supervisor.run().reason is EndReason.DEADLINE


def test_default_stall_grows_to_three_times_the_slowest_advance_so_far():
    clock = FakeClock()
    dog = Watchdog(10.0, WatchdogAction.FAIL, 3, WORKERS, clock, adaptive=True)
    dog.progress("worker.0", 1)
    clock.now = 8
    dog.progress("worker.0", 2)  # this job advances every 8 s: 24 s of silence are still normal
    clock.now = 8 + 20
    assert dog.check(WORKERS) is None
    clock.now = 8 + 25
    assert dog.check(WORKERS).seconds == 25
    explicit = Watchdog(10.0, WatchdogAction.FAIL, 3, WORKERS, clock)  # a stall the user set is kept
    clock.now = 0
    explicit.progress("worker.0", 1)
    clock.now = 8
    explicit.progress("worker.0", 2)
    clock.now = 8 + 11
    assert explicit.check(WORKERS) is not None


def test_no_stall_while_a_crashed_task_waits_to_restart_and_a_fresh_window_after_it(tmp_path):
    job = Job(tmp_path, "fail", restart={"policy": "on-failure", "max_restarts": 3, "backoff": "30s"})
    job.start()
    for name in WORKERS:
        job.dog.progress(name, 1)
    job.executor.handle("worker.1").exit(1)  # crashed: restarted in 30 s; the others wait for it
    wait_until(lambda: job.recorder.final().get("worker.1") is TaskState.RESTARTING, "worker.1 to wait")
    job.clock.now = 25  # well past the 10 s stall, while worker.1 is away
    threading.Event().wait(0.5)  # the supervisor polls every few tenths of a second
    assert job.results == [] and job.starts("worker.1") == 1
    job.clock.now = 31  # worker.1 is started again: a fresh window opens then
    wait_until(lambda: job.starts("worker.1") == 2, "worker.1 to start again")
    job.clock.now = 35
    threading.Event().wait(0.5)
    assert job.results == []
    job.clock.now = 42  # 11 s after the restart without progress: now it is a stall
    job.thread.join(10)
    [result] = job.results
    assert result.reason is EndReason.STALLED


def test_tasks_that_all_printed_the_same_last_step_are_blamed_together_not_the_first_to_print_it():
    clock = FakeClock()
    dog = watchdog(clock, training=("worker.0", "worker.1"))
    dog.progress("worker.0", 5)
    clock.now = 1
    dog.progress("worker.1", 5)  # the same step: no advance; then both hang
    clock.now = 20
    stall = dog.check(("worker.0", "worker.1"))
    assert stall.stuck == ("worker.0", "worker.1") and stall.why == "every worker prints, yet the step stays"
