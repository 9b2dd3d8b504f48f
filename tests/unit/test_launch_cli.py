"""The CLI in-process (injected Environment): exit codes for errors, dry run, status."""

import io
import json
import re
from pathlib import Path

from shoal.cli.environment import Environment
from shoal.cli.exit_codes import ExitCode
from shoal.cli.main import main


class Captured:
    def __init__(self, tmp_path: Path):
        self.out = io.StringIO()
        self.err = io.StringIO()
        self.env = Environment(environ={"SHOAL_HOME": str(tmp_path / "home")},
                               stdout=self.out, stderr=self.err, stdout_bytes=io.BytesIO(),
                               cwd=tmp_path)

    def __call__(self, *argv):
        return main(list(argv), self.env)


def write(tmp_path, text):
    (tmp_path / "job.yaml").write_text(text)
    return "job.yaml"


GOOD = "name: j\nparameters: {steps: 5}\nrun: python t.py --steps {{ steps }}\n" \
       "roles:\n  worker: {count: 2}\n  ps: {count: 1}\n"


def test_spec_errors_exit_with_spec_error_code_and_name_the_file(tmp_path):
    bad = {
        "bad yaml": "name: j\nroles: [\n",
        "unknown role": GOOD.replace("ps:", "boss:"),
        "negative count": GOOD.replace("count: 2", "count: -2"),
        "missing command": GOOD.replace("run: python t.py --steps {{ steps }}\n", ""),
        "unknown parameter": GOOD.replace("{{ steps }}", "{{ step }}"),
    }
    for case, text in bad.items():
        shoal = Captured(tmp_path)
        assert shoal("train", write(tmp_path, text)) == ExitCode.SPEC_ERROR, case
        assert shoal.err.getvalue().startswith("shoal train: error: job.yaml:"), case


def test_unknown_parameter_override_exits_with_spec_error(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("train", write(tmp_path, GOOD), "-p", "nope=1") == ExitCode.SPEC_ERROR
    assert "unknown parameter 'nope'" in shoal.err.getvalue()


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("train", write(tmp_path, GOOD), "--param", "steps=7", "--dry-run") == 0
    text = shoal.out.getvalue()
    # one `cd` line per task (counted at line starts: a job id's random suffix may end in "cd")
    assert len(re.findall(r"^\s*cd ", text, re.M)) == 3 and "t.py --steps 7" in text and "SHOAL_TASK=worker:1" in text
    assert not (tmp_path / "home" / "jobs.db").exists()


def test_a_role_pinned_to_another_host_of_a_job_on_this_machine_is_refused_not_run_here(tmp_path):
    pinned = GOOD.replace("worker: {count: 2}", "worker: {count: 2, hosts: [node1]}")
    shoal = Captured(tmp_path)
    assert shoal("train", write(tmp_path, pinned), "--dry-run") == ExitCode.PLAN_ERROR
    assert ("roles.worker.hosts names 'node1', but the job runs on this machine only (its hosts: none, or "
            "localhost alone); list them among the job's hosts (hosts:, --hosts or --hostfile) to run there over "
            "ssh") in shoal.err.getvalue()
    assert "cd " not in shoal.out.getvalue()
    here = Captured(tmp_path)  # pinned to localhost: this machine, as before
    assert here("train", write(tmp_path, pinned.replace("[node1]", "[localhost]")), "--dry-run") == 0


def test_run_flags_dry_run_builds_the_cluster(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--ps", "2", "--workers", "2", "--chief", "--dry-run", "--",
                 "python", "train.py", "--lr", "0.1") == 0
    text = shoal.out.getvalue()
    assert text.count("# job.") == 5 and "train.py --lr 0.1" in text


def test_run_negative_count_is_a_usage_error_naming_the_flag(tmp_path):
    for flag, said in (("--ps", "argument --ps: '-1' is not a number of ps"),
                       ("--workers", "argument --workers: '-1' is not a number of workers")):
        shoal = Captured(tmp_path)
        assert shoal("run", f"{flag}=-1", "--", "true") == ExitCode.USAGE, flag
        assert said in shoal.err.getvalue(), shoal.err.getvalue()


def test_status_json_is_an_empty_list_without_jobs(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("status", "--json") == 0
    assert json.loads(shoal.out.getvalue()) == []


def test_unknown_job_exits_with_not_found(tmp_path):
    shoal = Captured(tmp_path)
    for command in ("logs", "kill", "monitor", "tensorboard"):
        assert shoal(command, "nope") == ExitCode.JOB_NOT_FOUND, command


def test_usage_error_exits_2(tmp_path):
    assert Captured(tmp_path)("frobnicate") == ExitCode.USAGE


def test_tensorboard_without_tensorboard_says_how_to_install_it(tmp_path, monkeypatch):
    from shoal.cli import cmd_tensorboard
    from shoal.launch.executor_local import LocalExecutor
    from shoal.launch.plan import make_plan
    from shoal.launch.spec import spec_from_dict

    shoal = Captured(tmp_path)
    spec = spec_from_dict({"name": "tb", "run": "true", "roles": {"worker": {}}})
    plan = make_plan(spec, LocalExecutor(python="/py").allocate(spec), job_id="tb-1",
                     shoal_home=tmp_path / "home", workdir=tmp_path)
    with shoal.env.store() as store:
        store.create_job(plan, 1, 0.0)
    monkeypatch.setattr(cmd_tensorboard.importlib.util, "find_spec", lambda name: None)
    assert shoal("tensorboard", "tb") == ExitCode.MISSING_TOOL
    assert "pip install tensorboard" in shoal.err.getvalue()


def test_mnist_example_spec_plans_two_ps_and_two_workers(tmp_path):
    shoal = Captured(Path(__file__).resolve().parents[2])
    shoal.env.environ["SHOAL_HOME"] = str(tmp_path)  # type: ignore[index]
    assert shoal("train", "examples/mnist.yaml", "-p", "steps=300", "--dry-run") == 0
    text = shoal.out.getvalue()
    assert [line.split()[1] for line in text.splitlines() if line.startswith("# ")] == [
        "mnist.ps.0", "mnist.ps.1", "mnist.worker.0", "mnist.worker.1"]
    assert text.count("examples/mnist_softmax.py --steps 300") == 4


def test_dry_run_hides_the_job_secret(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("train", write(tmp_path, GOOD), "--dry-run") == 0
    text = shoal.out.getvalue()
    assert text.count("SHOAL_JOB_SECRET='<hidden: fresh per job>'") == 3
    assert not re.search(r"[0-9a-f]{64}", text)


def test_shoal_home_that_is_a_file_is_an_environment_error(tmp_path):
    shoal = Captured(tmp_path)
    (tmp_path / "home").write_text("not a directory")
    assert shoal("status") == ExitCode.ENVIRONMENT
    err = shoal.err.getvalue()
    assert err.startswith("shoal status: error: ") and err.count("\n") == 1
    assert str(tmp_path / "home") in err and "Traceback" not in err


def test_output_dir_that_cannot_be_created_is_an_environment_error(tmp_path):
    (tmp_path / "file").write_text("")
    for out_dir in (str(tmp_path / "file" / "model"), "/sys/shoal-read-only-test"):
        shoal = Captured(tmp_path)
        assert shoal("run", "--output-dir", out_dir, "--", "true") == ExitCode.ENVIRONMENT
        err = shoal.err.getvalue()
        assert err.startswith("shoal run: error: ") and err.count("\n") == 1, err
        assert out_dir.rsplit("/", 1)[0] in err


def test_os_and_recursion_errors_escaping_a_command_are_one_line(tmp_path, monkeypatch):
    from shoal.cli import cmd_status

    for error in (RecursionError("maximum recursion depth exceeded"),
                  OSError(28, "No space left on device", "/x/jobs.db")):
        def boom(args, env, error=error):
            raise error

        monkeypatch.setattr(cmd_status, "run", boom)
        shoal = Captured(tmp_path)
        assert shoal("status") == ExitCode.ENVIRONMENT
        err = shoal.err.getvalue()
        assert err.startswith("shoal status: error: ") and err.count("\n") == 1, err


def test_spec_nested_5000_deep_is_one_clear_line(tmp_path):
    shoal = Captured(tmp_path)
    text = "name: j\nroles: {worker: {}}\nrun: " + "[" * 5000 + "]" * 5000 + "\n"
    assert shoal("train", write(tmp_path, text)) in (ExitCode.SPEC_ERROR, ExitCode.ENVIRONMENT)
    err = shoal.err.getvalue()
    assert err.startswith("shoal train: error: ") and err.count("\n") == 1, err[:500]


def test_alias_bomb_dry_run_exits_with_spec_error(tmp_path):
    lines = ['a0: &a0 ["lol"]'] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = GOOD + "env:\n" + "".join(f"  {line}\n" for line in lines)
    shoal = Captured(tmp_path)
    assert shoal("train", write(tmp_path, bomb), "--dry-run") == ExitCode.SPEC_ERROR
    assert "alias" in shoal.err.getvalue()


def test_parameter_override_cannot_add_arguments_to_the_example(tmp_path):
    shoal = Captured(Path(__file__).resolve().parents[2])
    shoal.env.environ["SHOAL_HOME"] = str(tmp_path)  # type: ignore[index]
    assert shoal("train", "examples/mnist.yaml", "--dry-run",
                 "-p", "steps=300 --model_dir /tmp/x --learning_rate 50") == ExitCode.SPEC_ERROR
    assert "'steps' is an integer" in shoal.err.getvalue()


def test_monitor_interval_and_kill_timeout_must_be_durations_above_zero(tmp_path):
    for argv, bad in ((("monitor", "--interval", "-1"), "'-1' is not a duration"),
                      (("monitor", "--interval=nan"), "'nan' is not a duration"),
                      (("monitor", "--interval", "0"), "'0' is not more than 0 seconds"),
                      (("kill", "--timeout", "0s"), "'0s' is not more than 0 seconds")):
        shoal = Captured(tmp_path)
        assert shoal(*argv) == ExitCode.USAGE, argv
        assert bad in shoal.err.getvalue() and "Traceback" not in shoal.err.getvalue(), argv
    shoal = Captured(tmp_path)
    assert shoal("kill", "--timeout", "5m") != ExitCode.USAGE  # a duration like the spec's (no job: another error)
    assert "no jobs yet" in shoal.err.getvalue()


def test_run_flags_of_the_wrong_form_are_usage_errors_that_name_the_flag(tmp_path):
    for flag, value, bad in (("--deadline", "abc", "'abc' is not a duration of 0 or more"),
                             ("--grace", "x", "'x' is not a duration of 0 or more"),
                             ("--backoff", "-1s", "'-1s' is not a duration of 0 or more"),
                             ("--watchdog-stall", "abc", "'abc' is not a duration of 0 or more; write e.g. 0, 500ms,"
                                                         " 30s or 5m (or off)"),
                             ("--max-restarts", "-1", "'-1' is not a whole number of 0 or more")):
        shoal = Captured(tmp_path)
        assert shoal("run", f"{flag}={value}", "--dry-run", "--", "python", "t.py") == ExitCode.USAGE, flag
        assert f"argument {flag}: {bad}" in shoal.err.getvalue(), shoal.err.getvalue()
    for flag, value in (("--deadline", "10m"), ("--grace", "0"), ("--backoff", "500ms"), ("--watchdog-stall", "off"),
                        ("--watchdog-stall", "0"), ("--max-restarts", "0")):
        assert Captured(tmp_path)("run", flag, value, "--dry-run", "--", "python", "t.py") == 0, flag
    shoal = Captured(tmp_path)  # well formed, but no valid job: the spec's error, as before
    assert shoal("run", "--deadline", "0", "--dry-run", "--", "python", "t.py") == ExitCode.SPEC_ERROR


def test_run_without_a_command_is_a_usage_error_saying_where_it_goes(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "--workers", "2") == ExitCode.USAGE
    assert ("shoal run: error: no command given; write it after --, e.g. shoal run --workers 2 -- python train.py"
            in shoal.err.getvalue())


def test_run_with_an_env_flag_without_a_value_is_a_usage_error_showing_one(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("run", "-e", "FOO", "--", "python", "t.py") == ExitCode.USAGE
    assert "shoal run: error: -e 'FOO' is not NAME=VALUE; write e.g. -e FOO=value" in shoal.err.getvalue()


def test_a_spec_value_below_its_bound_names_the_bound_the_value_and_an_example(tmp_path):
    shoal = Captured(tmp_path)
    text = GOOD.replace("worker: {count: 2}", "worker: {count: 2, cpus: 0}")
    assert shoal("train", write(tmp_path, text), "--dry-run") == ExitCode.SPEC_ERROR
    assert "job.yaml:5: roles.worker.cpus: must be more than 0; give e.g. cpus: 2 (got 0)" in shoal.err.getvalue()


def test_a_negative_duration_in_a_spec_says_to_give_0_or_more(tmp_path):
    shoal = Captured(tmp_path)
    assert shoal("train", write(tmp_path, GOOD + "grace_period: -1\n"), "--dry-run") == ExitCode.SPEC_ERROR
    assert "grace_period: duration -1 is negative; give 0 or more, e.g. 5s" in shoal.err.getvalue()


def test_a_spec_error_that_a_parameter_override_may_have_caused_names_the_override(tmp_path):
    text = GOOD.replace("parameters: {steps: 5}", "parameters: {steps: 5, workers: 2}").replace(
        "worker: {count: 2}", "worker: {count: \"{{ workers }}\"}")
    shoal = Captured(tmp_path)
    assert shoal("train", write(tmp_path, text), "-p", "workers=-1", "--dry-run") == ExitCode.SPEC_ERROR
    err = shoal.err.getvalue()
    assert "roles.worker.count: " in err and "(parameters given: -p workers=-1)" in err
    assert Captured(tmp_path)("train", write(tmp_path, text), "-p", "workers=3", "--dry-run") == 0
