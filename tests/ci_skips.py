"""In CI a skipped test is a failure: a pytest plugin, on when SHOAL_CI=1 (.ci/run sets it).

CI installs everything the tests need (root, sshd, Slurm, torch, TensorFlow ...), so a skip there
means a test silently did not run. tests/conftest.py installs the plugin; any pytest run can load
it with `-p tests.ci_skips`. Outside CI, skips stay skips.
"""

from __future__ import annotations

import os

import pytest

ENV_VAR = "SHOAL_CI"


class SkipsFailTheSession:
    """Collects skipped tests (and skipped modules); a session with any ends with exit code 1."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []          # (node id, reason)

    def _note(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skipped.append((report.nodeid or str(report.fspath), reason))

    def pytest_runtest_logreport(self, report) -> None:
        self._note(report)

    def pytest_collectreport(self, report) -> None:
        self._note(report)

    def pytest_sessionfinish(self, session) -> None:
        if self.skipped and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.skipped:
            return
        terminalreporter.section(f"{ENV_VAR}=1: skipped tests fail the session", sep="=", red=True, bold=True)
        for nodeid, reason in self.skipped:
            terminalreporter.line(f"SKIPPED IN CI {nodeid} - {reason}", red=True)


def install(config: pytest.Config, environ: dict[str, str] | os._Environ) -> None:
    """Register SkipsFailTheSession when environ[SHOAL_CI] is "1"."""
    if environ.get(ENV_VAR) == "1" and not config.pluginmanager.has_plugin("shoal-ci-skips"):
        config.pluginmanager.register(SkipsFailTheSession(), "shoal-ci-skips")


def pytest_configure(config: pytest.Config) -> None:
    install(config, os.environ)
