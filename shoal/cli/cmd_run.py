"""`shoal run --ps 2 --workers 2 [--chief] -- python train.py ...`: a job from flags."""

from __future__ import annotations

import argparse

from shoal.cli.arg_types import duration_or_off_text, duration_text, whole_number
from shoal.cli.command_words import program_argv
from shoal.cli.environment import Environment
from shoal.cli.errors import UsageError
from shoal.cli.launching import add_launch_flags, launch
from shoal.cli.usage import option_strings
from shoal.launch.errors import SpecError
from shoal.launch.preflight import default_ps, script_of
from shoal.launch.spec import WatchdogAction, is_count_range, parse_count_range, spec_from_dict


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run", help="run a command as a ps/worker job, no spec file needed",
        description="Run COMMAND as every task of a job given by flags, e.g."
        " shoal run --ps 2 --workers 2 -- python train.py --lr 0.1")
    parser.add_argument("--name", default="job", help="job name (default: job)")
    parser.add_argument("--ps", type=ps_count, default=None, metavar="N",
                        help="parameter servers (default: 1 for a Shoal program: its script imports shoal and uses a "
                             "TrainingSession, shoal.Server, serve_unless_training or shoal.torch; else 0); a range "
                             "MIN..MAX (e.g. 2..4) starts MIN and lets shoal scale JOB ps=N add ps while the job runs "
                             "(never remove)")
    parser.add_argument("--workers", type=worker_count, default=1, metavar="N",
                        help="workers (default: 1); a range MIN..MAX (e.g. 2..8) starts MIN and lets"
                        " shoal scale JOB worker=N change it while the job runs")
    parser.add_argument("--chief", action="store_true", help="add a chief task")
    parser.add_argument("--evaluator", action="store_true", help="add an evaluator task")
    parser.add_argument("--restart", choices=("never", "on-failure"), default="never",
                        help="restart policy (default: never); a task that exits 2 within its first"
                        " second (a usage error) is never restarted")
    parser.add_argument("--max-restarts", type=whole_number, default=3, metavar="N",
                        help="restarts per task (default: 3)")
    parser.add_argument("--backoff", type=duration_text, default="1s",
                        help="wait before the first restart, doubling after (default: 1s)")
    parser.add_argument("--deadline", type=duration_text, default=None,
                        help="stop the job after e.g. 10m (default: none)")
    parser.add_argument("--grace", type=duration_text, default="5s", help="TERM-to-KILL grace period (default: 5s)")
    parser.add_argument("--watchdog-stall", type=duration_or_off_text, default=None, metavar="DURATION",
                        help="the progress watchdog's stall: act when the job's step does not advance"
                        " for this long, e.g. 5m (default: 5m, or twice the chief's --checkpoint_every_secs"
                        " if longer; off: no watchdog)")
    parser.add_argument("--watchdog-action", choices=[a.value for a in WatchdogAction], default="fail",
                        help="what the watchdog does on a stall: restart the stuck tasks, restart the"
                        " job (the chief resumes from its checkpoint) or fail it (default: fail)")
    parser.add_argument("--output-dir", default=None, help="model dir (default: the job's folder)")
    parser.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment variable for every task (repeatable)")
    add_launch_flags(parser)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    parser.program_flag_hint = _after_double_dash_hint
    parser.set_defaults(handler=run, options=tuple(option_strings(parser)))


def worker_count(text: str) -> "int | str":
    """argparse type of --workers: a whole number, or a range "MIN..MAX" (kept as text for the
    spec, which reads it as roles.worker.count)."""
    return _task_count(text, "is not a number of workers; write e.g. --workers 2 or a range --workers 2..8")


def ps_count(text: str) -> "int | str":
    """argparse type of --ps: a whole number (0 or more), or a range "MIN..MAX" (kept as text
    for the spec, which reads it as roles.ps.count)."""
    return _task_count(text, "is not a number of ps; write e.g. --ps 2 (0: none) or a range --ps 2..4")


def _task_count(text: str, why_not: str) -> "int | str":
    """A range as `_range` keeps it, else a whole number (`whole_number`, with `why_not` said of
    anything else)."""
    if is_count_range(text):
        return _range(text)
    try:
        return whole_number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} {why_not}") from None


def _range(text: str) -> str:
    try:
        parse_count_range(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return text.strip()


def _after_double_dash_hint(flag: str, value: str) -> str:
    """Where a flag for the training program goes, given to `shoal run` before `--`."""
    given = f"{flag} {value}" if value else flag
    return f"; the program's own flags go after --: shoal run [OPTIONS] -- python train.py {given}"


def run(args: argparse.Namespace, env: Environment) -> int:
    cmd = program_argv(args.cmd, args.options, "shoal run")
    if not cmd:
        raise UsageError("no command given; write it after --, e.g. shoal run --workers 2 -- python train.py")
    extra = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"-e {item!r} is not NAME=VALUE; write e.g. -e {name or 'NAME'}=value (an empty value:"
                             f" -e {name or 'NAME'}=)")
        extra[name] = value
    if args.workers == 0 and not args.chief:
        raise SpecError("--workers 0 leaves no task to train; give --workers 1 or more (or"
                        " add --chief)", source="flags")
    roles: dict = {"worker": {"count": args.workers}}
    ps = default_ps(cmd, env.cwd) if args.ps is None else args.ps
    if args.ps is None and not ps and args.workers != 1 and (script := script_of(cmd, env.cwd)) and script.is_file():
        env.say("shoal | no ps task: the command does not look like a Shoal program (its script does not use"
                " TrainingSession, shoal.Server, serve_unless_training or shoal.torch); if it needs parameter"
                " servers (a TensorFlow ParameterServerStrategy or TF1 ps program does), pass --ps N; --ps 0 says"
                " none and silences this", err=True)
    if ps:
        roles["ps"] = {"count": ps}
    if args.chief:
        roles["chief"] = {"count": 1}
    if args.evaluator:
        roles["evaluator"] = {"count": 1}
    data = {
        "name": args.name, "run": cmd, "roles": roles, "env": extra,
        "restart": {"policy": args.restart, "max_restarts": args.max_restarts,
                    "backoff": args.backoff},
        "deadline": args.deadline, "grace_period": args.grace, "output_dir": args.output_dir,
        "watchdog": {"stall": args.watchdog_stall, "action": args.watchdog_action},
    }
    return launch(spec_from_dict(data, source="flags"), args, env)
