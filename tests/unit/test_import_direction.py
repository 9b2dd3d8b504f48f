"""Dependencies point one way (../shared/STYLE.md): `cluster`, `errors` and `home` import nothing of
Shoal's but `errors`; `wire` imports only `errors`; `ps` never imports `train`; `launch` and `cli`
never import `ps`, `train` or `wire`; `wording` imports nothing and every package may use it.
Checked on the source of every module of every package."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "shoal"

# package (or top-level module) -> the Shoal packages it may import (besides itself)
ALLOWED = {
    "errors": {"errors"},
    "home": set(),
    "lazy": set(),
    "logs_default": set(),
    "sigterm": set(),
    "wording": set(),
    "cluster": {"errors"},
    "wire": {"errors"},
    "ps": {"errors", "cluster", "wire", "logs_default", "sigterm"},
    "train": {"errors", "cluster", "wire", "ps", "home", "lazy", "logs_default", "sigterm"},
    "torch": {"errors", "cluster", "wire", "ps", "train", "home", "lazy", "job_secret", "logs_default", "sigterm"},
    "datasets": {"errors"},
    "job_secret": {"home", "wire"},
    "launch": {"errors", "cluster", "home"},
    "cli": {"errors", "cluster", "home", "launch"},
}
USABLE_BY_ALL = {"wording"}  # imports nothing itself: a leaf any package may use


def shoal_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def package_of(path: Path) -> str:
    relative = path.relative_to(ROOT)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def modules():
    return sorted(p for p in ROOT.rglob("*.py") if p.name != "__init__.py" or p.parent != ROOT)


def test_every_package_has_a_rule():
    assert {package_of(p) for p in modules()} <= set(ALLOWED)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_only_what_its_package_may(path):
    package = package_of(path)
    for name in shoal_imports(path):
        if name == "shoal":
            assert package not in ("cluster", "errors", "home", "wire", "ps", "launch", "cli"), \
                f"{path.relative_to(ROOT)} imports the whole of shoal"
            continue
        if name.startswith("shoal."):
            target = name.split(".")[1]
            assert target == package or target in ALLOWED[package] | USABLE_BY_ALL, \
                f"{path.relative_to(ROOT)} ({package}) imports {name}"


EDGE_PROGRAMS = {"launch/agent.py"}  # a program of its own (its main is an edge), started on each host
# SHOAL_LOG_LEVEL is read where Shoal sets its logging up, as Python reads PYTHONWARNINGS: it must
# reach any program (a user's, with its own flags or none), not only those built on Shoal's flags
ENVIRONMENT_READERS = {"logs_default.py"}


@pytest.mark.parametrize("path", [p for p in modules() if package_of(p) != "cli"
                                  and str(p.relative_to(ROOT)) not in EDGE_PROGRAMS | ENVIRONMENT_READERS],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_environment_read_below_the_cli(path):
    """Configuration is read once, at the edge (the CLI, a program's main), and passed in."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                isinstance(node.value, ast.Name) and node.value.id == "os":
            raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} reads os.{node.attr}")
