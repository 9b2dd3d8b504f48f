"""The JOB argument the commands on recorded jobs share, so they all say the same (what a
reference may be: shoal/launch/job_refs.py)."""

from __future__ import annotations

import argparse

JOB_HELP = "job number (the # of shoal status), name (its newest job), id or id prefix"


RUNNING_FIRST = "the newest running job, else the newest job"
"""What a command on a live job (attach, kill, monitor, scale) takes without a JOB
(job_refs.find_running_job)."""


def add_job_argument(parser: argparse.ArgumentParser, *, newest_by_default: bool,
                     tasks: bool = False, running_first: bool = False) -> None:
    """Add the positional JOB: optional (the newest job; with `running_first` the newest
    running one) when `newest_by_default`; `tasks`: it may name a task too (12.worker.1)."""
    what = JOB_HELP + ("; or one task of it, e.g. 12.worker.1" if tasks else "")
    if newest_by_default:
        default = RUNNING_FIRST if running_first else "the newest job"
        parser.add_argument("job", nargs="?", metavar="JOB", help=f"{what} (default: {default})")
    else:
        parser.add_argument("job", metavar="JOB", help=what)
