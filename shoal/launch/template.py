"""`{{ param }}` templating of job-spec strings, and `-p name=value` overrides.

Pure functions, no I/O; thread-safe. Unknown names are errors, never left as text.

In a field, a string that is exactly one `{{ name }}` takes the parameter's own type (so
`count: "{{ workers }}"` is an int); otherwise the value is formatted into the string.

A command (`run:`) is argv first, then templated word by word (`render_command`), so a
value is always one argument, never more and never shell syntax:

* the string form is split like a shell (shlex) *before* any value is put in; the list
  form is argv as written;
* a word that is exactly `{{ name }}` becomes the value, as one word; an empty value
  gives no word at all (so `{{ sync }}` with `sync: ""` is an optional flag);
* a `{{ name }}` inside a word is formatted into that word, which stays one word;
* in a word that is a shell script, i.e. the script after `-c` of sh, bash, dash, zsh,
  ksh, mksh, ash, yash, csh or tcsh (also behind `env`, `nice`, `timeout` ...), every
  value is put in shell-quoted: it is one word of the script and cannot run a command; an
  empty value puts in nothing (so `{{ sync }}` is an optional flag there too).

A `{{` that opens no `{{ name }}` (`{{ steps }`) is an error, not text.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from shoal.launch.errors import SpecError

_TOKEN_RE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MARK_RE = re.compile("\x00([0-9]+)\x00")
_INT_RE = re.compile(r"[-+]?[0-9]+")
_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "csh", "tcsh"})
_SHELL_OPTIONS_WITH_VALUE = frozenset({"--rcfile", "--init-file"})


def render(value: str, params: Mapping[str, Any], *, field: str, source: str = "",
           line: int | None = None) -> Any:
    """Fill the `{{ name }}` tokens of `value` from `params`; SpecError names the field."""

    def lookup(name: str) -> Any:
        return _lookup(name, params, text=value, field=field, source=source, line=line)

    _refuse_unclosed(_TOKEN_RE.sub("", value), value, field=field, source=source, line=line)
    whole = _TOKEN_RE.fullmatch(value.strip())
    if whole:
        return lookup(whole.group(1))
    return _TOKEN_RE.sub(lambda m: _to_text(lookup(m.group(1))), value)


def _refuse_unclosed(literal: str, text: str, *, field: str, source: str, line: int | None) -> None:
    """SpecError if `literal` (`text` without its `{{ name }}` references) still holds a `{{`."""
    if "{{" in literal:
        raise SpecError(
            f"{text!r} has a {{{{ that opens no parameter reference (a missing }}}}?); write {{{{ name }}}}",
            source=source, line=line, field=field,
        )


def _lookup(name: str, params: Mapping[str, Any], *, text: str, field: str, source: str,
            line: int | None) -> Any:
    if not _NAME_RE.fullmatch(name):
        raise SpecError(
            f"{{{{ {name} }}}} is not a parameter reference; write {{{{ name }}}} with a"
            " name made of letters, digits and _",
            source=source, line=line, field=field,
        )
    if name not in params:
        known = ", ".join(sorted(params)) or "none"
        raise SpecError(
            f"unknown parameter {name!r} in {text!r} (parameters: {known}); add it"
            " under parameters: or fix the name",
            source=source, line=line, field=field,
        )
    return params[name]


def render_tree(node: Any, params: Mapping[str, Any], path: tuple = (),
                lines: Mapping[tuple, int] | None = None, source: str = "",
                is_command: Callable[[tuple], bool] = lambda path: False) -> Any:
    """Render every string inside a loaded YAML tree (dicts, lists, scalars); the nodes
    whose path `is_command` are commands, rendered by `render_command`."""
    lines = lines or {}
    if is_command(path):
        return render_command(node, params, path=path, lines=lines, source=source)
    if isinstance(node, str):
        return render(node, params, field=dotted(path), source=source, line=lines.get(path))
    if isinstance(node, Mapping):
        return {k: render_tree(v, params, path + (k,), lines, source, is_command)
                for k, v in node.items()}
    if isinstance(node, list):
        return [render_tree(v, params, path + (i,), lines, source, is_command)
                for i, v in enumerate(node)]
    return node


def render_command(run: Any, params: Mapping[str, Any], *, path: tuple = ("run",),
                   lines: Mapping[tuple, int] | None = None, source: str = "") -> Any:
    """The command `run` (a shell-like string or a list of words) with its parameters
    filled in, in the same form: a list stays a list of strings; a string is returned as
    the shell-quoted join of the final argv, so `shlex.split` gives back exactly the argv.
    Other values are returned unchanged for validation to refuse. SpecError names the
    field. See the module docstring for the rules."""
    lines = lines or {}
    if isinstance(run, str):
        words = _split_command(run, params, path=path, line=lines.get(path), source=source)
        return shlex.join(_fill_words(words, params))
    if isinstance(run, list):
        words = []
        for index, item in enumerate(run):
            if isinstance(item, (str, int, float)):  # bare numbers are words too; bool is int
                words.append(_Word(_to_text(item), params, path=path + (index,),
                                   line=lines.get(path + (index,)), source=source))
            else:
                return run
        return _fill_words(words, params)
    return run


class _Word:
    """One argv word as written: literal text and `{{ name }}` references, in order.

    `marks` are the names held out by `_split_command` (the word then holds NUL-delimited
    mark numbers instead of tokens); `shown` is the text that errors quote.
    """

    def __init__(self, text: str, params: Mapping[str, Any], *, path: tuple,
                 line: int | None, source: str, marks: Sequence[str] | None = None,
                 shown: str | None = None) -> None:
        self.parts: list[Union[str, tuple[str]]] = []  # a tuple holds a parameter name
        at = 0
        for match in (_TOKEN_RE if marks is None else _MARK_RE).finditer(text):
            name = match.group(1) if marks is None else marks[int(match.group(1))]
            _lookup(name, params, text=text if shown is None else shown, field=dotted(path),
                    source=source, line=line)
            self.parts += [text[at:match.start()], (name,)]
            at = match.end()
        self.parts.append(text[at:])
        self.parts = [part for part in self.parts if part != ""]
        _refuse_unclosed("\x00".join(p for p in self.parts if isinstance(p, str)), text if shown is None else shown,
                         field=dotted(path), source=source, line=line)

    def whole(self) -> bool:
        """Whether the word is exactly one `{{ name }}`."""
        return len(self.parts) == 1 and isinstance(self.parts[0], tuple)

    def fill(self, params: Mapping[str, Any], quote: Callable[[str], str]) -> str:
        return "".join(part if isinstance(part, str) else quote(_to_text(params[part[0]]))
                       for part in self.parts)


def _split_command(run: str, params: Mapping[str, Any], *, path: tuple, line: int | None,
                   source: str) -> list[_Word]:
    """Split `run` like a shell, with every `{{ name }}` held out as a mark that no value
    can fake (a NUL byte cannot be in an argument anyway)."""
    field = dotted(path)
    if "\x00" in run:
        raise SpecError("the command holds a NUL byte; remove it", source=source, line=line,
                        field=field)
    names: list[str] = []

    def mark(match: re.Match) -> str:
        names.append(match.group(1))
        return f"\x00{len(names) - 1}\x00"

    try:
        texts = shlex.split(_TOKEN_RE.sub(mark, run))
    except ValueError as e:
        raise SpecError(
            f"cannot split the command into words: {e} (an unbalanced quote?); quote each"
            " argument that holds spaces, or write run: as a list of words",
            source=source, line=line, field=field,
        ) from e
    return [_Word(text, params, path=path, line=line, source=source, marks=names, shown=run)
            for text in texts]


def _fill_words(words: list[_Word], params: Mapping[str, Any]) -> list[str]:
    """Final argv: whole-word values verbatim (empty ones dropped), values inside shell
    scripts shell-quoted, other values formatted in."""
    kept = [w for w in words if not (w.whole() and w.fill(params, str) == "")]
    plain = [w.fill(params, str) for w in kept]
    scripts = _shell_scripts(plain)
    return [w.fill(params, _script_quote) if i in scripts else text
            for i, (w, text) in enumerate(zip(kept, plain))]


def _script_quote(value: str) -> str:
    """A value as one word of a shell script; an empty one as nothing (an optional flag)."""
    return shlex.quote(value) if value else ""


def _shell_scripts(argv: list[str]) -> set[int]:
    """Indices of the words of `argv` that a shell runs as a script (`sh -c SCRIPT`).

    Any word naming a shell counts, so `env A=1 sh -c ...` and `timeout 9 bash -lc ...`
    are found; options between the shell and its script are skipped, with the value of
    `-o`/`+o`/`-O`/`+O` (also at the end of a cluster, `-eo pipefail`), `--rcfile` and
    `--init-file`. Errs towards finding too many: a value quoted needlessly is safe.
    """
    out = set()
    for start, word in enumerate(argv):
        if os.path.basename(word) not in _SHELLS:
            continue
        at, command = start + 1, False
        while at < len(argv):
            option = argv[at]
            at += 1
            if option == "--":
                break
            if option in _SHELL_OPTIONS_WITH_VALUE:
                at += 1
            elif option.startswith("--"):
                continue
            elif len(option) > 1 and option[0] in "-+":
                command |= option[0] == "-" and "c" in option[1:]
                if option[-1] in "oO":
                    at += 1
            else:
                at -= 1
                break
        if command and at < len(argv):
            out.add(at)
    return out


def parse_overrides(items: Sequence[str], params: Mapping[str, Any]) -> dict[str, Any]:
    """Apply `name=value` overrides to `params`; each value is read as the type of the
    declared parameter (int, float, true/false, or the text as it is for a string).

    An override of a parameter the spec does not declare, or a value that is not of the
    declared type, is a SpecError (a typo would otherwise be silently ignored).
    """
    out = dict(params)
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not _NAME_RE.fullmatch(name):
            raise SpecError(
                f"parameter override {item!r} is not name=value; write e.g. -p steps=300",
                source="command line", field="--param",
            )
        if name not in params:
            known = ", ".join(sorted(params)) or "none"
            raise SpecError(
                f"unknown parameter {name!r} (the spec declares: {known}); declare it under"
                " parameters: or fix the name",
                source="command line", field="--param",
            )
        out[name] = _typed(name, text, params[name])
    return out


def _typed(name: str, text: str, declared: Any) -> Any:
    """`text` read as the type of `declared`; SpecError if it is not one."""
    word = text.strip()
    if isinstance(declared, bool):
        value: Any = _BOOLS.get(word.lower())
        kind = "true or false"
    elif isinstance(declared, int):
        value = int(word) if _INT_RE.fullmatch(word) else None
        kind = "an integer"
    elif isinstance(declared, float):
        try:
            value = float(word)
        except ValueError:
            value = None
        kind = "a number"
    else:
        return text
    if value is None:
        raise SpecError(
            f"parameter {name!r} is {kind} (the spec declares {name}: {_to_text(declared)}),"
            f" not {text!r}; write e.g. -p {name}={_to_text(declared)}",
            source="command line", field="--param",
        )
    return value


def dotted(path: tuple) -> str:
    """("roles", "worker", "count") -> "roles.worker.count"; list items as [i]."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _to_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
