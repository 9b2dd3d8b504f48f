"""`shoal` entry point: parses the subcommand, runs it, maps errors to exit codes."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from shoal.cli import (cmd_attach, cmd_check, cmd_kill, cmd_logs, cmd_monitor, cmd_prune, cmd_run,
                       cmd_scale, cmd_status, cmd_tensorboard, cmd_train)
from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode, exit_code_for
from shoal.cli.usage import ArgumentsError, ShoalParser, unknown_command, unrecognized
from shoal.errors import ShoalError
from shoal.launch.agent import shoal_version

COMMANDS = (cmd_train, cmd_run, cmd_status, cmd_logs, cmd_attach, cmd_scale, cmd_kill, cmd_check,
            cmd_monitor, cmd_tensorboard, cmd_prune)


def build_parser() -> ShoalParser:
    """The parser of `shoal` and every subcommand (`.commands` maps names to theirs)."""
    parser = ShoalParser(
        prog="shoal", description="Start, watch and stop parameter-server training jobs.",
        epilog="JOB is a job's number (the # of shoal status), its name (its newest job),"
        " its id or a unique prefix of it; commands that take a JOB use the newest job"
        " when none is given (kill: the newest running one). shoal COMMAND -h tells more.")
    parser.add_argument("--version", action="version", version=f"shoal {shoal_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    parser.commands = dict(sub.choices)
    return parser


def parse(parser: ShoalParser, argv: list[str]) -> argparse.Namespace:
    """The parsed command line; ArgumentsError (with a suggestion) if it is wrong. -h and
    --version print (to sys.stdout, as argparse does) and raise SystemExit(0)."""
    error = unknown_command(parser, argv)
    if error is not None:
        raise error
    args, extras = parser.parse_known_args(argv)
    if extras:
        raise unrecognized(parser.commands.get(args.command, parser), extras, argv)
    return args


def main(argv: Optional[Sequence[str]] = None, env: Optional[Environment] = None) -> int:
    """Run `shoal ARGV` in `env`; returns the exit code (the console script exits with it)."""
    env = env or Environment.from_process()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parse(parser, argv)
    except SystemExit as e:  # argparse printed --help or --version
        return int(ExitCode.OK) if not e.code else int(ExitCode.USAGE)
    except ArgumentsError as e:
        env.say(e.parser.format_usage().rstrip("\n"), err=True)
        env.say(f"{e.parser.prog}: error: {e}", err=True)
        return int(ExitCode.USAGE)
    if args.command is None:  # `shoal` alone
        env.say(parser.format_help(), end="")
        return int(ExitCode.OK)
    args.argv = tuple(argv)  # the command line, for a launcher that runs it again in the background
    try:
        return int(args.handler(args, env))
    except BrokenPipeError:  # `shoal logs | head`: the reader has what it wanted
        _quiet_stdout()
        return int(ExitCode.PIPE_CLOSED)
    except (ShoalError, OSError, RecursionError) as e:
        env.say(f"shoal {args.command}: error: {describe(e)}", err=True)
        return int(exit_code_for(e))
    except KeyboardInterrupt:
        env.say("", err=True)
        return int(ExitCode.KILLED)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of a closed pipe prints no
    'Exception ignored' either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file (tests pass streams)
        pass


def describe(error: BaseException) -> str:
    """The error as the one line `shoal` prints (a ShoalError's own message)."""
    if isinstance(error, RecursionError):
        return ("the input is nested too deeply to process (Python's recursion limit);"
                " flatten it")
    if isinstance(error, OSError):
        paths = " -> ".join(str(p) for p in (error.filename, error.filename2) if p)
        text = error.strerror or str(error)
        return (f"{text}{': ' + paths if paths else ''}; check that the path exists, is a"
                " directory where one is needed, and can be written (SHOAL_HOME,"
                " --output-dir, output_dir:, workdir:)")
    return str(error)


def entry() -> None:
    """Console-script style entry: exit with main()'s code."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
