"""`ShoalParser`: the argparse parser of `shoal` and its subcommands, which raises
`ArgumentsError` instead of printing and exiting, so that `main` prints the message (with
a "did you mean" for a near miss) to the command's own streams and picks the exit code.

Python 3.11's argparse has no suggestions of its own; difflib finds the closest name.
Pure: no I/O (argparse's own -h/--version output goes where `main` redirects it).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Sequence
from typing import NoReturn, Optional

from shoal.cli.errors import UsageError


class ArgumentsError(UsageError):
    """argparse refused the command line; `parser` is the (sub)parser that did."""

    def __init__(self, message: str, parser: argparse.ArgumentParser) -> None:
        super().__init__(message)
        self.parser = parser


class ShoalParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are exceptions (ArgumentsError). Subparsers made
    from it are ShoalParsers too; `commands` maps the subcommands to theirs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        raise ArgumentsError(message, self)


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option `parser` takes ("--workers", "-e", ...; argparse has no public way)."""
    return [s for action in parser._actions for s in action.option_strings]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"; did you mean X?" for the choice closest to `word`, "" if none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def unknown_command(parser: ShoalParser, argv: Sequence[str]) -> Optional[ArgumentsError]:
    """The error for a first word that is no command of `parser`, else None."""
    if not argv or argv[0].startswith("-") or argv[0] in parser.commands:
        return None
    word = argv[0]
    return ArgumentsError(
        f"unknown command {word!r}{did_you_mean(word, parser.commands)} (commands:"
        f" {', '.join(parser.commands)}; shoal -h explains them)", parser)


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> ArgumentsError:
    """The error for arguments `parser` (the command's parser) did not take: for the first
    that looks like an option, the command's option it misspells, else the command's
    `program_flag_hint` (a flag meant for the training program: where that goes)."""
    hint = ""
    for i, extra in enumerate(extras):
        if extra.startswith("-") and len(extra) > 1:
            name, _, value = extra.partition("=")
            hint = _misspelt_option(name, option_strings(parser))
            if not hint:
                if not value and i + 1 < len(extras) and not extras[i + 1].startswith("-"):
                    value = extras[i + 1]
                program_flag_hint = getattr(parser, "program_flag_hint", None)
                hint = program_flag_hint(name, value) if program_flag_hint is not None else ""
            break
    return ArgumentsError(f"unrecognized arguments: {' '.join(extras)}{hint}", parser)


def _misspelt_option(name: str, options: Sequence[str]) -> str:
    """"; did you mean --X?" when `name` is close to one of `options` once their dashes are
    left out ("--steps" is not "--hosts"), "" otherwise."""
    bare = {option.lstrip("-"): option for option in options}
    close = difflib.get_close_matches(name.lstrip("-"), list(bare), n=1, cutoff=0.75)
    return f"; did you mean {bare[close[0]]}?" if close else ""
