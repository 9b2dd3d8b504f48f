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


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str],
                 argv: Sequence[str] = ()) -> ArgumentsError:
    """The error for arguments `parser` (the command's parser) did not take: the first that
    misspells one of the command's options, named; else, for the first that looks like an
    option, the command's `program_flag_hint` (a flag meant for the training program: where
    that goes), with its value as `argv` (the whole command line) gives it."""
    flags = [extra for extra in extras if extra.startswith("-") and len(extra) > 1]
    options = option_strings(parser)
    hint = next((h for h in (_misspelt_option(f.partition("=")[0], options) for f in flags) if h), "")
    program_flag_hint = getattr(parser, "program_flag_hint", None)
    if not hint and flags and program_flag_hint is not None:
        name, _, value = flags[0].partition("=")
        hint = program_flag_hint(name, value or _value_after(flags[0], argv))
    return ArgumentsError(f"unrecognized arguments: {' '.join(extras)}{hint}", parser)


def _value_after(flag: str, argv: Sequence[str]) -> str:
    """The word after `flag` on the command line when it reads as its value (not another
    option, nor `--`; a negative number is a value), else ""."""
    words = list(argv)
    if flag not in words:
        return ""
    after = words[words.index(flag) + 1:words.index(flag) + 2]
    if not after or after[0] == "--" or (after[0].startswith("-") and not _is_number(after[0])):
        return ""
    return after[0]


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _misspelt_option(name: str, options: Sequence[str]) -> str:
    """"; did you mean --X?" when `name` is close to one of `options` once their dashes are
    left out ("--steps" is not "--hosts"), and is not a whole word of it ("--config" is a
    program's flag, not a misspelt "--ssh-config"); "" otherwise."""
    bare = name.lstrip("-")
    candidates = {option.lstrip("-"): option for option in options
                  if bare not in option.lstrip("-").split("-") or "-" not in option.lstrip("-")}
    close = difflib.get_close_matches(bare, list(candidates), n=1, cutoff=0.75)
    return f"; did you mean {candidates[close[0]]}?" if close else ""
