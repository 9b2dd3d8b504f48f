"""The SHOAL_CI=1 rule: a skipped test fails the session and is named with its reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SUITE = {
    "test_some.py": "import pytest\n\n"
                    "def test_runs():\n    pass\n\n"
                    "def test_needs_a_thing():\n    pytest.skip('needs the thing')\n\n"
                    "@pytest.mark.xfail(reason='known bug', strict=True)\n"
                    "def test_known_bug():\n    assert False\n",
    "test_module_skip.py": "import pytest\n\npytest.importorskip('no_such_module_shoal')\n\n"
                           "def test_never_collected():\n    pass\n",
}


def run_inner_pytest(tmp_path: Path, files: dict[str, str], ci: str | None) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if ci is not None:
        env["SHOAL_CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.ci_skips", "-p", "no:cacheprovider",
                           "-rs", str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_skips_fail_the_session_naming_test_and_reason_when_shoal_ci_is_1(tmp_path):
    done = run_inner_pytest(tmp_path, SUITE, ci="1")
    assert done.returncode == 1, done.stdout
    assert "SKIPPED IN CI test_some.py::test_needs_a_thing - Skipped: needs the thing" in done.stdout
    assert "SKIPPED IN CI test_module_skip.py" in done.stdout and "no_such_module_shoal" in done.stdout
    assert "test_known_bug" not in done.stdout.split("skipped tests fail the session")[1]


def test_skips_stay_skips_without_shoal_ci(tmp_path):
    done = run_inner_pytest(tmp_path, SUITE, ci=None)
    assert done.returncode == 0, done.stdout
    assert "SKIPPED IN CI" not in done.stdout


def test_session_without_skips_passes_when_shoal_ci_is_1(tmp_path):
    done = run_inner_pytest(tmp_path, {"test_some.py": "def test_runs():\n    pass\n"}, ci="1")
    assert done.returncode == 0, done.stdout
