"""The command line itself, in-process: help, version, suggestions for unknown flags and
commands, words that stray between the options and `--`, `--workers 0`, the dry run's
secret."""

import re

from shoal.cli.exit_codes import ExitCode
from shoal.launch.agent import shoal_version

from tests.unit.cli_harness import Captured


def test_shoal_alone_prints_help_on_stdout(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal() == ExitCode.OK
    text = shoal.out.getvalue()
    assert text.startswith("usage: shoal") and "status" in text and "prune" in text
    assert shoal.err.getvalue() == ""


def test_dash_h_prints_help_and_exits_0(tmp_path, capsys):
    shoal = Captured(tmp_path)
    assert shoal("-h") == ExitCode.OK
    assert "Start, watch and stop" in capsys.readouterr().out
    shoal = Captured(tmp_path)
    assert shoal("run", "-h") == ExitCode.OK
    assert "--workers" in capsys.readouterr().out


def test_version_prints_the_package_version(tmp_path, capsys):
    shoal = Captured(tmp_path)
    assert shoal("--version") == ExitCode.OK
    assert capsys.readouterr().out == f"shoal {shoal_version()}\n"


def test_unknown_flag_gets_a_did_you_mean(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--wrkers", "2", "--", "true") == ExitCode.USAGE
    err = shoal.err.getvalue()
    assert "shoal run: error: unrecognized arguments: --wrkers" in err
    assert "did you mean --workers?" in err
    shoal = Captured(tmp_path)
    assert shoal("--verison") == ExitCode.USAGE
    assert "did you mean --version?" in shoal.err.getvalue()


def test_unknown_command_gets_a_did_you_mean(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("stauts") == ExitCode.USAGE
    assert "unknown command 'stauts'; did you mean status?" in shoal.err.getvalue()


def test_a_word_between_the_options_and_double_dash_is_an_error_naming_it(tmp_path):
    shoal = Captured(tmp_path)
    code = shoal("run", "--deadline", "10", "minutes", "--dry-run", "--", "python", "t.py")
    assert code == ExitCode.USAGE
    err = shoal.err.getvalue()
    assert err.count("\n") == 1 and "'minutes'" in err and "before --" in err
    assert not (shoal.home / "jobs.db").exists()  # nothing ran


def test_shoal_option_after_the_command_words_is_rejected(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "1", "python", "t.py", "--dry-run") == ExitCode.USAGE
    err = shoal.err.getvalue()
    assert "--dry-run" in err and "before the command" in err and " -- " in err
    assert not (shoal.home / "jobs.db").exists()


def test_options_after_double_dash_go_to_the_program(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--dry-run", "--", "python", "t.py", "--workers", "9") == ExitCode.OK
    assert "t.py --workers 9" in shoal.out.getvalue()


def test_workers_0_is_a_one_line_error(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "0", "--", "python", "t.py") == ExitCode.SPEC_ERROR
    err = shoal.err.getvalue()
    assert err.count("\n") == 1 and "--workers 0" in err and len(err) < 200, err


def test_workers_0_with_a_chief_is_a_job(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "0", "--chief", "--dry-run", "--", "true") == ExitCode.OK
    assert shoal.out.getvalue().count("# job.") == 1


def test_dry_run_masks_the_secret_unless_show_secret(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "2", "--dry-run", "--", "true") == ExitCode.OK
    assert shoal.out.getvalue().count("SHOAL_JOB_SECRET='<hidden") == 2
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "2", "--dry-run", "--show-secret", "--", "true") == 0
    secrets = re.findall(r"SHOAL_JOB_SECRET=([0-9a-f]{64}) ", shoal.out.getvalue())
    assert len(secrets) == 2 and secrets[0] == secrets[1]


def test_show_secret_without_dry_run_is_a_usage_error(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--show-secret", "--", "true") == ExitCode.USAGE
    assert "--dry-run" in shoal.err.getvalue()


def test_a_program_flag_given_to_shoal_says_where_it_goes(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml", "--steps", "300") == ExitCode.USAGE
    err = shoal.err.getvalue()
    assert "unrecognized arguments: --steps 300; shoal train passes no flags to the program: set a parameter" in err
    assert "-p steps=300 (the spec's {{ steps }})" in err and "did you mean" not in err
    shoal = Captured(tmp_path)
    assert shoal("run", "--steps=300", "--", "python", "t.py") == ExitCode.USAGE
    err = shoal.err.getvalue()
    assert "the program's own flags go after --: shoal run [OPTIONS] -- python train.py --steps 300" in err
    shoal = Captured(tmp_path)
    assert shoal("run", "--steps", "300", "--", "python", "t.py") == ExitCode.USAGE
    assert "-- python train.py --steps 300" in shoal.err.getvalue()
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml", "--lr", "-0.1") == ExitCode.USAGE  # a negative number is a value
    assert "-p lr=-0.1 " in shoal.err.getvalue()
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml", "--config", "c.yaml") == ExitCode.USAGE  # a word of --ssh-config, not it
    assert "did you mean" not in shoal.err.getvalue() and "-p config=c.yaml" in shoal.err.getvalue()


def test_a_misspelt_option_is_named_wherever_it_stands(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml", "--dry_run") == ExitCode.USAGE  # a misspelt option of shoal's own
    assert "did you mean --dry-run?" in shoal.err.getvalue()
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml", "--seed", "1", "--dry_run") == ExitCode.USAGE  # after a program's flag
    assert "did you mean --dry-run?" in shoal.err.getvalue() and "-p seed" not in shoal.err.getvalue()


def test_a_value_given_to_an_on_off_option_is_named_and_the_options_left_unread_after_it(tmp_path):
    shoal = Captured(tmp_path)
    code = shoal("run", "--chief", "1", "--ps", "2", "--workers", "2", "--", "python", "t.py")
    assert code == ExitCode.USAGE
    err = shoal.err.getvalue()
    assert ("'1' stands between shoal run's options and --, where only options go, so shoal run read none of the"
            " options after it (--ps, --workers)") in err and "(--chief, not --chief 1)" in err, err
