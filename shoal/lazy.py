"""`lazy_exports`: a package's public names, each imported from its module on first use, so
importing the package stays cheap (the launcher never loads the runtime; a ps never loads the
session). Imports nothing of Shoal's; thread-safe as Python's imports are."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_exports(package: str, namespace: dict[str, Any],
                 exports: dict[str, tuple[str, ...]]) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The `__getattr__`, `__dir__` and `__all__` of `package` (whose globals are `namespace`),
    exporting each name of `exports` (module -> names) from its module."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__, sorted(module_of)
