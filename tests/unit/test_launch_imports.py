"""Dependency direction: the launcher and the CLI import only shoal.cluster, shoal.errors,
shoal.home and shoal.wording from the rest of Shoal, never the runtime (ps, train, wire)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "shoal"
ALLOWED = ("shoal.cluster", "shoal.errors", "shoal.home", "shoal.wording", "shoal.launch", "shoal.cli")


def shoal_imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_launch_and_cli_import_only_cluster_errors_home_and_wording_from_shoal():
    files = list((ROOT / "launch").rglob("*.py")) + list((ROOT / "cli").rglob("*.py"))
    assert len(files) > 10
    for path in files:
        for name in shoal_imports(path):
            if name == "shoal" or name.startswith("shoal."):
                assert name.startswith(ALLOWED), f"{path.name} imports {name}"


def test_reaper_imports_nothing_from_shoal():
    names = list(shoal_imports(ROOT / "launch" / "reaper.py"))
    assert not [n for n in names if n.startswith("shoal")]

