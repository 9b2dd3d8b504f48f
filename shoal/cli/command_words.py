"""`program_argv`: the program `shoal run` is to run, taken from the words argparse left
after the command's own options, refusing what would silently do the wrong thing.

    shoal run [OPTIONS] -- PROGRAM ARGS...     everything after -- is the program's
    shoal run [OPTIONS] PROGRAM ARGS...        too, unless a word after PROGRAM is one of
                                               shoal run's options (--dry-run, --workers ...):
                                               meant for shoal or for the program? refused
    shoal run --deadline 10 minutes -- ...     a word between the options and -- ('minutes')
                                               is refused, never run as the program; so is
    shoal run --chief 1 --workers 2 -- ...     one after an on/off option (and the options
                                               after it, which argparse left unread)

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from shoal.cli.errors import UsageError


def program_argv(words: Sequence[str], options: Iterable[str], command: str) -> list[str]:
    """The program's argv from `words` (argparse's REMAINDER after the options of
    `command`, e.g. "shoal run"); `options` are that command's option strings.
    UsageError naming the word, with the fix, for a stray word or a misplaced option."""
    words = list(words)
    if words[:1] == ["--"]:
        return words[1:]
    known = set(options)
    if "--" in words:
        stray = words[:words.index("--")]
        unread = [w for w in stray if w.split("=", 1)[0] in known]
        unread_said = (f", so {command} read none of the options after it ({', '.join(unread)})"
                       if unread else "")
        raise UsageError(
            f"{stray[0]!r} stands between {command}'s options and --, where only options go{unread_said};"
            " an option's value is one word (--deadline 10m, not --deadline 10 minutes) and an on/off"
            " option takes none (--chief, not --chief 1): put every option before -- and the command"
            " after it")
    misplaced = [w for w in words[1:] if w.split("=", 1)[0] in known]
    if misplaced:
        option = misplaced[0]
        raise UsageError(
            f"{option} comes after the command words ({words[0]} ...), so it is unclear whether"
            f" it is for {command} or for the program; for {command}, put it before the"
            f" command: {command} {option} ... -- {words[0]} ...; for the program, put the"
            f" command after --: {command} [OPTIONS] -- {' '.join(words)}")
    return words
