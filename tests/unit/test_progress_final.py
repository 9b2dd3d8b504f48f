"""ProgressReporter.finish: a last line with the step the worker trained to, unless the last
regular line already said it; the launcher reads it as progress, the benchmarks' rate
readers (which need examples/s=) do not."""

import io
import re

from shoal.launch.progress_line import ProgressLine, parse_progress
from shoal.train.progress import ProgressReporter


class _Session:
    task = "worker:0"
    summaries = None
    checkpointer = None


def _reporter(every: int) -> tuple[ProgressReporter, io.StringIO]:
    out = io.StringIO()
    return ProgressReporter(_Session(), every=every, batch_size=10, out=out), out


def test_finish_prints_the_final_step_and_last_loss_after_a_partial_interval():
    reporter, out = _reporter(every=4)
    for step, loss in enumerate([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], start=1):
        reporter.step_done(loss, step)
    reporter.finish(7)  # the pull after the loop may see another replica's step too
    *_, last = out.getvalue().splitlines()
    assert last == "worker:0 step=7 loss=0.4000 final"
    assert parse_progress(last.encode()) == ProgressLine(7, 0.4)
    assert not re.search(r"examples/s=", last)


def test_finish_prints_nothing_when_the_last_line_said_that_step_or_no_step_ran():
    reporter, out = _reporter(every=2)
    reporter.step_done(0.5, 1)
    reporter.step_done(0.4, 2)
    printed = out.getvalue()
    reporter.finish(2)
    assert out.getvalue() == printed and printed.startswith("worker:0 step=2 ")
    idle, idle_out = _reporter(every=2)
    idle.finish(5)
    assert idle_out.getvalue() == ""


def test_finish_twice_prints_once():
    reporter, out = _reporter(every=10)
    reporter.step_done(0.5, 3)
    reporter.finish(3)
    reporter.finish(3)
    assert out.getvalue().count("final") == 1
