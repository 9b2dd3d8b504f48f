"""Pre-flight checks before a job starts (shoal/launch/preflight.py): a missing script and a
Shoal program without a ps are one clear error with nothing started; `shoal run` gives a Shoal
program one ps by default and says so in --help. In-process CLI with an injected environment."""

from pathlib import Path

import pytest

from shoal.cli.exit_codes import ExitCode
from shoal.launch.preflight import is_shoal_program, script_of
from tests.unit.test_launch_cli import Captured

SHOAL_PROGRAM = "import os\nimport shoal\n\nsession_type = shoal.TrainingSession\nprint('training')\n"


@pytest.mark.parametrize("argv, script", [
    (["python", "train.py", "--lr", "0.1"], "train.py"),
    (["/usr/bin/python3.11", "-u", "-W", "ignore", "-X", "dev", "sub/train.py"], "sub/train.py"),
    (["python3", "-uB", "train.py"], "train.py"),
    (["./train.py", "--steps", "3"], "train.py"),
    (["python", "-c", "print(1)"], None),
    (["python", "-uc", "print(1)"], None),
    (["python", "-m", "not_here.module"], None),
    (["bash", "run.sh"], None),
    (["python"], None),
])
def test_script_of_a_command_is_its_first_python_script_argument(tmp_path, argv, script):
    assert script_of(argv, tmp_path) == (None if script is None else tmp_path / script)


def test_script_of_python_dash_m_is_the_modules_file_under_the_workdir(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(SHOAL_PROGRAM)
    assert script_of(["python", "-m", "pkg.train"], tmp_path) == tmp_path / "pkg" / "train.py"
    assert is_shoal_program(["python", "-m", "pkg.train"], tmp_path)


def test_a_shoal_program_is_one_that_imports_shoal(tmp_path):
    (tmp_path / "a.py").write_text(SHOAL_PROGRAM)
    (tmp_path / "b.py").write_text("from shoal.train import TrainingSession\n")
    (tmp_path / "c.py").write_text("import torch  # not shoal\nx = 'import shoal'\n")
    (tmp_path / "d.py").write_text("from shoal.datasets.mnist import load_mnist  # a helper only: no ps\n")
    assert is_shoal_program(["python", "a.py"], tmp_path) and is_shoal_program(["python", "b.py"], tmp_path)
    assert not is_shoal_program(["python", "c.py"], tmp_path)
    assert not is_shoal_program(["python", "d.py"], tmp_path)
    assert not is_shoal_program(["python", "examples/mnist_mlp_plain.py"], Path(__file__).resolve().parents[2])
    assert not is_shoal_program(["python", "missing.py"], tmp_path)


def nothing_started(tmp_path: Path) -> bool:
    return not (tmp_path / "home" / "jobs").exists()


def test_run_of_a_missing_script_is_one_error_naming_the_path_and_starts_nothing(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "2", "--", "python", "missing.py") == ExitCode.SPEC_ERROR
    err = shoal.err.getvalue()
    assert err.count("\n") == 1 and f"{tmp_path / 'missing.py'}, which does not exist" in err, err
    assert nothing_started(tmp_path)


def test_train_of_a_spec_whose_script_is_missing_starts_nothing(tmp_path):
    (tmp_path / "job.yaml").write_text("name: j\nrun: python nope/train.py\nroles: {worker: {count: 1}}\n")
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml") == ExitCode.SPEC_ERROR
    assert "nope/train.py, which does not exist" in shoal.err.getvalue()
    assert "or start shoal in the directory it is relative to, or set workdir: in the spec" in shoal.err.getvalue()
    assert nothing_started(tmp_path)


def test_a_missing_script_in_a_roles_own_run_is_named_at_its_file_line_and_field(tmp_path):
    (tmp_path / "ok.py").write_text("print('fine')\n")
    (tmp_path / "job.yaml").write_text("name: j\nrun: python ok.py\nroles:\n  ps: {count: 0}\n  worker:\n"
                                       "    count: 1\n    run: python nope/work.py\n")
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml") == ExitCode.SPEC_ERROR
    err = shoal.err.getvalue()
    assert "job.yaml:7: roles.worker.run: j.worker.0 would run " in err and "nope/work.py, which does not exist" in err, err
    (tmp_path / "job.yaml").write_text("name: j\n\nrun: python nope/train.py\nroles: {worker: {count: 1}}\n")
    assert shoal("train", "job.yaml") == ExitCode.SPEC_ERROR
    assert "job.yaml:3: run: j.worker.0 would run " in shoal.err.getvalue(), shoal.err.getvalue()
    assert nothing_started(tmp_path)


def test_a_spec_whose_workdir_does_not_exist_says_so_not_that_its_script_is_missing(tmp_path):
    (tmp_path / "job.yaml").write_text("name: j\nworkdir: nowhere\nrun: sh -c 'echo hi'\nroles: {worker: {count: 1}}\n")
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml") == ExitCode.SPEC_ERROR
    assert f"the job's workdir {tmp_path / 'nowhere'} does not exist; fix workdir:" in shoal.err.getvalue()
    assert nothing_started(tmp_path)


def test_a_shoal_program_with_no_ps_is_refused_before_it_starts(tmp_path):
    (tmp_path / "train.py").write_text(SHOAL_PROGRAM)
    (tmp_path / "job.yaml").write_text("name: j\nrun: python train.py\nroles: {worker: {count: 2}}\n")
    shoal = Captured(tmp_path)
    assert shoal("train", "job.yaml") == ExitCode.SPEC_ERROR
    err = shoal.err.getvalue()
    assert "a Shoal program (it trains on parameter servers), but the job has no ps task" in err, err
    assert "--ps 1" in err and "--ps 0 runs it anyway" in err, err
    assert nothing_started(tmp_path)


def test_run_gives_a_shoal_program_one_ps_by_default(tmp_path):
    (tmp_path / "train.py").write_text(SHOAL_PROGRAM)
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "2", "--dry-run", "--", "python", "train.py") == 0
    assert shoal.out.getvalue().count("# job.ps.") == 1


def test_run_gives_other_programs_no_ps_by_default(tmp_path):
    (tmp_path / "train.py").write_text("import torch\n")
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "2", "--dry-run", "--", "python", "train.py") == 0
    assert "# job.ps." not in shoal.out.getvalue()


def test_run_help_shows_the_defaults(tmp_path, capsys):
    shoal = Captured(tmp_path)
    assert shoal("run", "--help") == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 1 for a Shoal program: its script imports shoal and uses a TrainingSession, "
                    "shoal.Server, serve_unless_training or shoal.torch; else 0)", "workers (default: 1)",
                    "(default: never)", "(default: 3)", "(default: 1s)", "(default: 5s)"):
        assert default in text, default


def test_run_of_several_workers_of_a_program_that_is_not_shoals_says_it_starts_no_ps(tmp_path):
    (tmp_path / "tf_ps.py").write_text("import tensorflow as tf\n")
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "2", "--dry-run", "--", "python", "tf_ps.py") == ExitCode.OK
    assert "no ps task: the command does not look like a Shoal program" in shoal.err.getvalue()
    assert "pass --ps N" in shoal.err.getvalue() and "ps.0" not in shoal.out.getvalue()
    quiet = Captured(tmp_path)
    assert quiet("run", "--workers", "2", "--ps", "0", "--dry-run", "--", "python", "tf_ps.py") == ExitCode.OK
    assert "no ps task" not in quiet.err.getvalue()
