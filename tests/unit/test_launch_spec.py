"""Job specs: loading, templating, overrides, and errors that name file, line and field."""

import pytest

from shoal.launch.errors import SpecError
from shoal.launch.spec import RestartPolicy, load_spec, parse_duration, parse_memory, spec_from_dict

GOOD = """\
name: mnist
parameters:
  steps: 200
  workers: 2
run: python train.py --steps {{ steps }}
roles:
  ps: {count: 2}
  worker:
    count: "{{ workers }}"
    cpus: 2
    memory: 2GiB
    env: {FOO: 1}
restart: {policy: on-failure, max_restarts: 2, backoff: 500ms}
deadline: 10m
"""


def load(tmp_path, text, overrides=()):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_spec(path, tuple(overrides), source="job.yaml")


def error(tmp_path, text, overrides=()):
    with pytest.raises(SpecError) as info:
        load(tmp_path, text, overrides)
    return info.value


def test_spec_loads_roles_templates_and_policies(tmp_path):
    spec = load(tmp_path, GOOD)
    assert spec.run == "python train.py --steps 200"
    assert spec.count("worker") == 2 and spec.count("ps") == 2 and spec.count("chief") == 0
    worker = spec.role("worker")
    assert worker.memory == 2 * 2**30 and worker.cpus == 2 and worker.env == {"FOO": "1"}
    assert spec.restart.policy is RestartPolicy.ON_FAILURE and spec.restart.backoff == 0.5
    assert spec.deadline == 600


def test_override_replaces_parameter_with_its_yaml_type(tmp_path):
    spec = load(tmp_path, GOOD, ["steps=300", "workers=3"])
    assert spec.run == "python train.py --steps 300" and spec.count("worker") == 3


def test_unknown_override_is_an_error_naming_the_declared_parameters(tmp_path):
    e = error(tmp_path, GOOD, ["stepz=3"])
    assert "unknown parameter 'stepz'" in str(e) and "steps, workers" in str(e)


def test_unknown_parameter_in_template_names_line_and_field(tmp_path):
    e = error(tmp_path, GOOD.replace("{{ steps }}", "{{ epochs }}"))
    assert str(e).startswith("job.yaml:5: run: unknown parameter 'epochs'")


def test_bad_yaml_names_the_line(tmp_path):
    e = error(tmp_path, GOOD.replace("ps: {count: 2}", "ps: {count: 2"))
    assert e.line == 8 and "invalid YAML" in str(e)


def test_unknown_role_names_line_and_suggests(tmp_path):
    e = error(tmp_path, GOOD.replace("  ps:", "  pss:"))
    assert str(e).startswith("job.yaml:7: roles.pss: 'pss' is not a role (did you mean 'ps'?)")


def test_negative_count_names_line_and_field(tmp_path):
    e = error(tmp_path, GOOD.replace("{count: 2}", "{count: -1}"))
    assert e.line == 7 and e.field == "roles.ps.count" and "greater than or equal to 0" in str(e)


def test_missing_command_is_an_error(tmp_path):
    e = error(tmp_path, GOOD.replace("run: python train.py --steps {{ steps }}\n", ""))
    assert e.field == "run" and "is missing" in str(e)


def test_unknown_field_is_an_error(tmp_path):
    e = error(tmp_path, GOOD.replace("deadline: 10m", "dedline: 10m"))
    assert e.line == 14 and e.field == "dedline" and "not a known field" in str(e)


def test_job_without_chief_or_worker_is_an_error(tmp_path):
    with pytest.raises(SpecError, match="no chief and no worker"):
        spec_from_dict({"name": "x", "run": "true", "roles": {"ps": {"count": 1}}})


def test_two_chiefs_are_an_error():
    with pytest.raises(SpecError, match="one chief"):
        spec_from_dict({"name": "x", "run": "true", "roles": {"chief": {"count": 2}}})


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read the job spec"):
        load_spec(tmp_path / "nope.yaml")


def test_durations_and_memory_sizes_parse():
    assert parse_duration("1h") == 3600 and parse_duration(5) == 5.0
    assert parse_memory("512MiB") == 512 * 2**20 and parse_memory("1G") == 10**9
    with pytest.raises(ValueError):
        parse_duration("soon")
