"""`{{ param }}` templating of job-spec strings, and `-p name=value` overrides.

Pure functions, no I/O; thread-safe. A string that is exactly one `{{ name }}` takes the
parameter's own type (so `count: "{{ workers }}"` is an int); otherwise the value is
formatted into the string. Unknown names are errors, never left as text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from shoal.launch.errors import SpecError

_TOKEN_RE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def render(value: str, params: Mapping[str, Any], *, field: str, source: str = "",
           line: int | None = None) -> Any:
    """Fill the `{{ name }}` tokens of `value` from `params`; SpecError names the field."""

    def lookup(name: str) -> Any:
        if not _NAME_RE.fullmatch(name):
            raise SpecError(
                f"{{{{ {name} }}}} is not a parameter reference; write {{{{ name }}}} with a"
                " name made of letters, digits and _",
                source=source, line=line, field=field,
            )
        if name not in params:
            known = ", ".join(sorted(params)) or "none"
            raise SpecError(
                f"unknown parameter {name!r} in {value!r} (parameters: {known}); add it"
                " under parameters: or fix the name",
                source=source, line=line, field=field,
            )
        return params[name]

    whole = _TOKEN_RE.fullmatch(value.strip())
    if whole:
        return lookup(whole.group(1))
    return _TOKEN_RE.sub(lambda m: _to_text(lookup(m.group(1))), value)


def render_tree(node: Any, params: Mapping[str, Any], path: tuple = (),
                lines: Mapping[tuple, int] | None = None, source: str = "") -> Any:
    """Render every string inside a loaded YAML tree (dicts, lists, scalars)."""
    if isinstance(node, str):
        return render(node, params, field=dotted(path), source=source,
                      line=(lines or {}).get(path))
    if isinstance(node, Mapping):
        return {k: render_tree(v, params, path + (k,), lines, source) for k, v in node.items()}
    if isinstance(node, list):
        return [render_tree(v, params, path + (i,), lines, source) for i, v in enumerate(node)]
    return node


def parse_overrides(items: Sequence[str], params: Mapping[str, Any]) -> dict[str, Any]:
    """Apply `name=value` overrides to `params`; values are read as YAML scalars.

    An override of a parameter the spec does not declare is a SpecError (a typo would
    otherwise be silently ignored).
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
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        out[name] = value if isinstance(value, (str, int, float, bool)) else text
    return out


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
