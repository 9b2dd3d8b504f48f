"""`shoal prune [--keep N] [--older-than 7d] [--dry-run]`: remove finished jobs — their
folders (logs, and the model dir when it is the job's own) and their records. Jobs still
running are never touched; neither is an output_dir outside the job's folder."""

from __future__ import annotations

import argparse
import time

from shoal.cli.environment import Environment
from shoal.cli.errors import UsageError
from shoal.cli.exit_codes import ExitCode
from shoal.launch.control import launcher_alive, reconcile
from shoal.launch.prune import prunable, remove_job
from shoal.launch.spec import parse_duration
from shoal.wording import counted


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "prune", help="remove finished jobs: their records, logs and job folders",
        description="Remove jobs that are over (SUCCEEDED, FAILED, KILLED): each job's folder"
        " under $SHOAL_HOME/jobs (its logs, and its model dir unless output_dir put that"
        " elsewhere) and its records. Running jobs are never touched. Without options every"
        " finished job goes; --keep and --older-than spare some.")
    parser.add_argument("--keep", type=int, default=0, metavar="N",
                        help="spare the N newest finished jobs (default 0)")
    parser.add_argument("--older-than", metavar="AGE",
                        help="only jobs that ended at least AGE ago, e.g. 12h or 7d")
    parser.add_argument("--dry-run", action="store_true",
                        help="list what would be removed, remove nothing")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, env: Environment) -> int:
    if args.keep < 0:
        raise UsageError(f"--keep {args.keep}: give 0 or more jobs to keep")
    try:
        older_than = None if args.older_than is None else parse_duration(args.older_than)
    except ValueError as e:
        raise UsageError(f"--older-than: {e}") from e
    with env.store() as store:
        jobs = [reconcile(store, job, env.executor(job.executor)) for job in store.list_jobs()]
        chosen = prunable(jobs, keep=args.keep, older_than=older_than, now=time.time(),
                          running=launcher_alive)
        if not chosen:
            env.say("nothing to prune")
            return int(ExitCode.OK)
        verb = "would remove" if args.dry_run else "removed"
        chosen_ids = {job.id for job in chosen}
        in_use = [job.model_dir for job in jobs if job.id not in chosen_ids and job.model_dir]
        for job in reversed(chosen):  # oldest first
            pruned = remove_job(store, job, env.shoal_home / "jobs", dry_run=args.dry_run, in_use=in_use)
            what = pruned.removed_dir or "its records only"
            line = f"{verb} job {job.handle} ({job.state.value}): {what}"
            if pruned.left:
                line += f"; left {', '.join(pruned.left)}"
            env.say(line)
    env.say(f"{verb} {counted(len(chosen), 'finished job')}")
    return int(ExitCode.OK)
