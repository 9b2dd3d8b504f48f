"""The line a job that did not succeed ends with when its own model dir holds checkpoints that a
new job would not use."""

from pathlib import Path

import pytest

from shoal.launch.executor_local import LocalExecutor
from shoal.launch.plan import make_plan
from shoal.launch.resume_hint import newest_checkpoint_step, resume_hint
from shoal.launch.spec import spec_from_dict
from shoal.launch.supervisor import EndReason, JobResult


def plan_in(home: Path, **extra):
    spec = spec_from_dict({"name": "m", "run": "python t.py", "roles": {"worker": {"count": 1}}, **extra})
    return make_plan(spec, LocalExecutor(python="/py").allocate(spec), job_id="m-1", shoal_home=home,
                     workdir=home)


def checkpoints(model_dir: Path, *names: str) -> None:
    for name in names:
        (model_dir / "checkpoints" / name).mkdir(parents=True)


KILLED = JobResult(EndReason.STOPPED, "stopped by shoal kill")


@pytest.mark.parametrize("reason", [EndReason.STOPPED, EndReason.TASK_FAILED, EndReason.CHIEF_FAILED,
                                    EndReason.DEADLINE, EndReason.STALLED])
def test_a_job_that_did_not_succeed_says_where_its_newest_checkpoint_is_and_what_resumes_from_it(tmp_path, reason):
    plan = plan_in(tmp_path)
    checkpoints(Path(plan.model_dir), "ckpt-0000000200", "ckpt-0000001400", "ckpt-0000000900")
    hint = resume_hint(plan, JobResult(reason, "it ended"))
    assert hint == (f"shoal | job m-1 saved checkpoints in its own model dir {plan.model_dir} (the newest at step"
                    " 1400); a job started again gets a new one and starts from step 0: add --output-dir"
                    f" {plan.model_dir} (output_dir: in a spec) to resume from that checkpoint")


def test_a_job_that_succeeded_or_was_given_its_model_dir_says_nothing(tmp_path):
    plan = plan_in(tmp_path)
    checkpoints(Path(plan.model_dir), "ckpt-0000000200")
    assert resume_hint(plan, JobResult(EndReason.SUCCEEDED, "done")) == ""
    given = plan_in(tmp_path, output_dir=str(tmp_path / "mine"))
    checkpoints(tmp_path / "mine", "ckpt-0000000200")
    assert resume_hint(given, KILLED) == ""  # the same model dir again resumes by itself


def test_no_checkpoint_no_line_and_only_checkpoint_directories_count(tmp_path):
    plan = plan_in(tmp_path)
    assert resume_hint(plan, KILLED) == ""  # no model dir at all
    root = Path(plan.model_dir) / "checkpoints"
    checkpoints(Path(plan.model_dir), "damaged-ckpt-0000000500", ".tmp-ckpt-0000000600-h-1-x", "ckpt-latest")
    (root / "ckpt-0000000700").write_text("a file, not a checkpoint")
    assert newest_checkpoint_step(root) is None and resume_hint(plan, KILLED) == ""
    checkpoints(Path(plan.model_dir), "ckpt-0000000300")
    assert newest_checkpoint_step(root) == 300
