"""`shoal` entry point: parses the subcommand, runs it, maps errors to exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from shoal.cli import (cmd_attach, cmd_check, cmd_kill, cmd_logs, cmd_monitor, cmd_run,
                       cmd_status, cmd_tensorboard, cmd_train)
from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode, exit_code_for
from shoal.errors import ShoalError

COMMANDS = (cmd_train, cmd_run, cmd_status, cmd_logs, cmd_attach, cmd_kill, cmd_check,
            cmd_monitor, cmd_tensorboard)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shoal", description="Start, watch and stop parameter-server training jobs.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None, env: Optional[Environment] = None) -> int:
    """Run `shoal ARGV` in `env`; returns the exit code (the console script exits with it)."""
    env = env or Environment.from_process()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed --help (code 0) or a usage error
        return int(ExitCode.OK) if not e.code else int(ExitCode.USAGE)
    args.argv = tuple(argv)  # the command line, for a launcher that runs it again in the background
    try:
        return int(args.handler(args, env))
    except (ShoalError, OSError, RecursionError) as e:
        env.say(f"shoal {args.command}: error: {describe(e)}", err=True)
        return int(exit_code_for(e))
    except KeyboardInterrupt:
        env.say("", err=True)
        return int(ExitCode.KILLED)


def describe(error: BaseException) -> str:
    """The error as the one line `shoal` prints (a ShoalError's own message)."""
    if isinstance(error, BrokenPipeError):
        return "the output was closed before shoal finished writing it (broken pipe)"
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
