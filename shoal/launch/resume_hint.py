"""`resume_hint`: the line that tells how to resume a job that did not succeed from the
checkpoints it saved in its own model dir.

Without `output_dir:` (`--output-dir`) a job's model dir is `<job dir>/model`, new for every
job, so a job started again — after `shoal kill`, a deadline, a failure, a Slurm job that ended
under it — starts from scratch, and the work the chief saved on its way out stays behind unused
(docs/launcher.md, "Stopping saves the work"). When such a job ends with checkpoints there (the
layout of docs/checkpoints.md: `checkpoints/ckpt-<step>`), the launcher says where they are and
what to add to resume from them.

Only what this machine sees: the checkpoints of a chief on another host whose model dir is not
shared stay there (the launcher copies back summaries, not checkpoints), and no line is said.
Pure but for listing one directory; blocks on that.
"""

from __future__ import annotations

import re
from pathlib import Path

from shoal.launch.plan import CHECKPOINTS_DIR, JobPlan, own_model_dir
from shoal.launch.supervisor import EndReason, JobResult

_CHECKPOINT = re.compile(r"ckpt-(\d+)")


def resume_hint(plan: JobPlan, result: JobResult) -> str:
    """The line to say after `plan`'s job ended with `result`, or "" when there is nothing to
    resume (it succeeded), its model dir was given (a job given the same one resumes by itself),
    or that model dir holds no checkpoint this machine can see."""
    model_dir = Path(plan.model_dir)
    if result.reason is EndReason.SUCCEEDED or model_dir != own_model_dir(Path(plan.job_dir)):
        return ""
    step = newest_checkpoint_step(model_dir / CHECKPOINTS_DIR)
    if step is None:
        return ""
    return (f"shoal | job {plan.job_id} saved checkpoints in its own model dir {model_dir} (the newest at step"
            f" {step}); a job started again gets a new one and starts from step 0: add --output-dir {model_dir}"
            " (output_dir: in a spec) to resume from that checkpoint")


def newest_checkpoint_step(root: Path) -> int | None:
    """The step of the newest `ckpt-<step>` directory in `root`, or None if there is none
    (or `root` cannot be read). Blocks on listing `root`."""
    try:
        steps = [int(m.group(1)) for p in root.iterdir() if (m := _CHECKPOINT.fullmatch(p.name)) and p.is_dir()]
    except OSError:
        return None
    return max(steps, default=None)
