"""Shoal's INFO lines reach stderr when a program set up no logging, and never fight a program's
own logging configuration (shoal/logs_default.py). Each case runs in a fresh interpreter: the
logging configuration is per process, and pytest's own handlers would hide the behaviour."""

import os
import subprocess
import sys
import textwrap

from shoal.launch.ports import free_ports


def run(code: str, level: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_LOG_LEVEL"}
    if level is not None:
        env["SHOAL_LOG_LEVEL"] = level
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, check=True, env=env)


SERVER = """
    import shoal
    port = {port}
    server = shoal.Server({{"ps": [f"127.0.0.1:{{port}}"], "worker": ["127.0.0.1:1"]}},
                          secret=shoal.JobSecret(b"s" * 32, "test"))
    server.start()
    server.stop()
"""


def test_shoal_info_lines_reach_stderr_when_the_program_set_up_no_logging():
    port = free_ports(1)[0]
    out = run(SERVER.format(port=port))
    assert f"INFO shoal.ps.server: ps:0 serving at 127.0.0.1:{port}" in out.stderr
    assert out.stdout == ""


def test_a_program_that_configured_logging_keeps_its_configuration():
    port = free_ports(1)[0]
    out = run("import logging, sys\nlogging.basicConfig(level=logging.WARNING, stream=sys.stdout)\n"
              + textwrap.dedent(SERVER.format(port=port)))
    assert "serving at" not in out.stderr + out.stdout


def test_a_level_set_on_the_shoal_logger_is_kept():
    out = run("""
        import logging
        from shoal.logs_default import show_shoal_logs
        logging.getLogger("shoal").setLevel(logging.WARNING)
        show_shoal_logs()
        logging.getLogger("shoal.x").info("an info line")
        logging.getLogger("shoal.x").warning("a warning line")
    """)
    assert "an info line" not in out.stderr
    assert "WARNING shoal.x: a warning line" in out.stderr


def test_logging_configured_later_takes_over_without_printing_twice():
    out = run("""
        import logging, sys
        from shoal.logs_default import show_shoal_logs
        assert show_shoal_logs()
        logging.getLogger("shoal.x").info("before")
        logging.basicConfig(level=logging.WARNING, format="ROOT %(message)s", stream=sys.stderr)
        logging.getLogger("shoal.x").info("just after")
        logging.getLogger("shoal.x").info("later")
        logging.getLogger("shoal.x").warning("warned")
        print(logging.getLogger("shoal").handlers, logging.getLogger("shoal").level)
    """)
    assert out.stderr.count("before") == 1
    assert "later" not in out.stderr  # the program's WARNING level rules again
    assert out.stderr.count("warned") == 1 and "ROOT warned" in out.stderr
    assert out.stdout.strip() == "[] 0"


def test_showing_shoal_logs_twice_installs_one_handler():
    out = run("""
        import logging
        from shoal.logs_default import show_shoal_logs
        print(show_shoal_logs(), show_shoal_logs(), len(logging.getLogger("shoal").handlers))
    """)
    assert out.stdout.split() == ["True", "False", "1"]


LINES = """
    import logging
    from shoal.logs_default import show_shoal_logs
    show_shoal_logs()
    logging.getLogger("shoal.x").debug("a debug line")
    logging.getLogger("shoal.x").info("an info line")
    logging.getLogger("shoal.x").warning("a warning line")
"""


def test_shoal_log_level_in_the_environment_sets_the_level_shoal_gives_its_logger():
    debug = run(LINES, level="debug").stderr
    assert "DEBUG shoal.x: a debug line" in debug and "an info line" in debug
    warning = run(LINES, level="WARNING").stderr
    assert "an info line" not in warning and "a warning line" in warning


def test_a_shoal_log_level_that_names_no_level_is_said_and_ignored():
    out = run(LINES, level="loud").stderr
    assert "SHOAL_LOG_LEVEL='loud' is not a log level; ignored (write one of DEBUG, INFO, WARNING, ERROR)" in out
    assert "a debug line" not in out and "an info line" in out


def test_shoal_log_level_reaches_a_program_that_configured_its_own_handlers():
    out = run("""
        import logging, sys
        logging.basicConfig(level=logging.INFO, format="ROOT %(levelname)s %(message)s", stream=sys.stderr)
        from shoal.logs_default import show_shoal_logs
        assert not show_shoal_logs()  # its handlers stay the only ones
        logging.getLogger("shoal.x").debug("a shoal debug line")
        logging.getLogger("mine").debug("the program's debug line")
    """, level="DEBUG").stderr
    assert out.count("a shoal debug line") == 1 and "ROOT DEBUG a shoal debug line" in out
    assert "the program's debug line" not in out  # the program's own level is its own
