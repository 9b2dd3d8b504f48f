"""`shoal train SPEC.yaml [-p name=value]... [--output-dir DIR] [--dry-run]`: run the job a YAML spec describes."""

from __future__ import annotations

import argparse

from shoal.cli.environment import Environment
from shoal.cli.launching import add_launch_flags, launch
from shoal.launch.spec import load_spec


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="run the job described by a YAML spec",
                            description="Run the job described by a YAML spec, in the"
                            " foreground, until it SUCCEEDS, FAILS or is KILLED.")
    parser.add_argument("spec", help="the job spec (YAML); see docs/launcher.md")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override a parameter declared under parameters: (repeatable)")
    parser.add_argument("--output-dir", default=None,
                        help="model dir, in place of the spec's output_dir: (default: that, else the job's folder);"
                        " a job given the model dir of one before it resumes from its checkpoints")
    add_launch_flags(parser)
    parser.program_flag_hint = _spec_parameter_hint
    parser.set_defaults(handler=run)


def _spec_parameter_hint(flag: str, value: str) -> str:
    """Where a flag for the training program goes, given to `shoal train` instead."""
    name = flag.lstrip("-").replace("-", "_") or "NAME"
    return (f"; shoal train passes no flags to the program: set a parameter the spec declares with -p {name}="
            f"{value or 'VALUE'} (the spec's {{{{ {name} }}}}), or put the flag in the spec's run:")


def run(args: argparse.Namespace, env: Environment) -> int:
    spec = load_spec(env.cwd / args.spec, tuple(args.param), source=args.spec)
    if args.output_dir is not None:
        spec = spec.model_copy(update={"output_dir": args.output_dir})  # (keeps where the spec was read)
    return launch(spec, args, env)
