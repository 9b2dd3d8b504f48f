"""Job specs: loading, templating, overrides, and errors that name file, line and field."""

import pytest

from shoal.launch.errors import SpecError
from shoal.launch.spec import RestartPolicy, RoleSpec, load_spec, parse_duration, spec_from_dict

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


def test_an_unquoted_template_value_gets_the_quoting_hint_and_other_bad_yaml_does_not(tmp_path):
    e = error(tmp_path, GOOD.replace('count: "{{ workers }}"', "count: {{ workers }}"))
    assert "invalid YAML" in str(e) and 'must be quoted, e.g. count: "{{ workers }}"' in str(e), str(e)
    e = error(tmp_path, "```\n" + GOOD)  # a fence pasted along: the spec still has "{{ workers }}", quoted
    assert str(e) == "job.yaml:1: invalid YAML: found character '`' that cannot start any token", str(e)


def test_unknown_role_names_line_and_suggests(tmp_path):
    e = error(tmp_path, GOOD.replace("  ps:", "  pss:"))
    assert str(e).startswith("job.yaml:7: roles.pss: 'pss' is not a role (did you mean 'ps'?)")


@pytest.mark.parametrize("count", ["-1", "2.5", "true", "two", "\"²\""])
def test_a_count_that_is_no_number_of_tasks_names_line_field_and_fix(tmp_path, count):
    e = error(tmp_path, GOOD.replace("{count: 2}", f"{{count: {count}}}"))
    assert e.line == 7 and e.field == "roles.ps.count", str(e)
    assert "is not a number of tasks; write a whole number such as 2" in str(e), str(e)


def test_a_whole_count_written_as_a_float_or_a_string_is_a_count(tmp_path):
    spec = load(tmp_path, GOOD.replace("{count: 2}", "{count: 3.0}").replace('"{{ workers }}"', '"4"'))
    assert spec.count("ps") == 3 and spec.count("worker") == 4


def test_a_check_over_several_fields_points_at_the_field_it_names(tmp_path):
    e = error(tmp_path, GOOD.replace("  ps: {count: 2}", "  ps: {count: 2}\n  chief: {count: 2}"))
    assert (e.line, e.field) == (8, "roles.chief.count") and str(e).endswith("must be 0 or 1: a cluster has one chief")


def test_a_deadline_of_0_is_refused_not_taken_as_none(tmp_path):
    e = error(tmp_path, GOOD.replace("deadline: 10m", "deadline: 0"))
    assert e.line == 14 and e.field == "deadline" and "leave deadline out for none" in str(e)
    assert load(tmp_path, GOOD.replace("deadline: 10m", "deadline: null")).deadline is None


def test_missing_command_is_an_error(tmp_path):
    e = error(tmp_path, GOOD.replace("run: python train.py --steps {{ steps }}\n", ""))
    assert e.field == "run" and "is missing" in str(e)


def test_unknown_field_is_an_error(tmp_path):
    e = error(tmp_path, GOOD.replace("deadline: 10m", "dedline: 10m"))
    assert e.line == 14 and e.field == "dedline" and "not a known field" in str(e)


def test_a_misspelt_field_gets_the_nearest_known_one_at_its_level(tmp_path):
    e = error(tmp_path, GOOD.replace("deadline: 10m", "dedline: 10m"))
    assert "dedline: is not a known field (did you mean 'deadline'?)" in str(e)
    e = error(tmp_path, GOOD.replace("ps: {count: 2}", "ps: {cont: 2}").replace("policy:", "polcy:"))
    assert str(e).splitlines()[0].endswith("roles.ps.cont: is not a known field (did you mean 'count'?)"), str(e)
    assert "also job.yaml:13: restart.polcy: is not a known field (did you mean 'policy'?)" in str(e)
    e = error(tmp_path, GOOD.replace("deadline: 10m", "xyzzy: 1"))
    assert "xyzzy: is not a known field; check its spelling" in str(e)


def test_a_misspelt_section_is_named_before_what_it_leaves_missing_or_unfilled(tmp_path):
    e = error(tmp_path, GOOD.replace("roles:", "rolez:"))
    assert (e.field, e.line) == ("rolez", 6) and "(did you mean 'roles'?)" in str(e) and "missing" not in str(e)
    e = error(tmp_path, GOOD.replace("parameters:", "parameter:"))  # its {{ steps }} would be unknown
    assert e.field == "parameter" and "(did you mean 'parameters'?)" in str(e) and "steps" not in str(e)


@pytest.mark.parametrize("old, new, field, says", [
    ("restart: {policy: on-failure, max_restarts: 2, backoff: 500ms}", "restart: on-failure", "restart",
     "must be a mapping; write e.g. restart: {policy: on-failure, max_restarts: 3} (got 'on-failure')"),
    ("env: {FOO: 1}", "env: [A, B]", "roles.worker.env", "must be a mapping; write e.g. env: {NAME: value}"),
    ("deadline: 10m", "output_dir: 5", "output_dir", 'must be text; quote it: output_dir: "..." (got 5)'),
    ("deadline: 10m", "watchdog: 5m", "watchdog", "must be a mapping; write e.g. watchdog: {stall: 5m"),
])
def test_a_value_of_the_wrong_shape_is_refused_with_an_example_of_the_right_one(tmp_path, old, new, field, says):
    assert old in GOOD
    e = error(tmp_path, GOOD.replace(old, new))
    assert e.field == field and says in str(e) and "Input should" not in str(e), str(e)


@pytest.mark.parametrize("extra, field, says", [
    ({"restart": 3}, "restart", "write e.g. restart: {policy: on-failure, max_restarts: 3} (got 3)"),
    ({"run": 5}, "run", "must be a command: text, or a list of words (got 5)"),
    ({"hosts": [5]}, "hosts[0]", "must be a host name or a mapping; write e.g. hosts: [node1, {name: node2"),
    ({"roles": {"worker": {"hosts": [5]}}}, "roles.worker.hosts[0]", 'must be text; quote it: "..." (got 5)'),
    ({"roles": {5: {"count": 1}}}, "roles[5]", "a role is named, not numbered; roles are chief, worker, ps"),
])
def test_wrong_shapes_in_lists_unions_and_with_digits_in_the_example_are_worded_right(extra, field, says):
    with pytest.raises(SpecError) as info:
        spec_from_dict({"name": "t", "run": "python t.py", "roles": {"worker": {"count": 1}}, **extra})
    assert info.value.field == field and says in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_memory_size_that_cannot_be_read_says_how_sizes_are_written(tmp_path):
    e = error(tmp_path, GOOD.replace("memory: 2GiB", "memory: 2 gigs"))
    assert e.field == "roles.worker.memory" and "is not a size; write e.g. 512MiB, 2GiB or 1.5GB (got '2 gigs')" in str(e)


def test_job_without_chief_or_worker_is_an_error(tmp_path):
    with pytest.raises(SpecError) as e:
        spec_from_dict({"name": "x", "run": "true", "roles": {"ps": {"count": 1}}})
    assert e.value.field == "(top level)" and str(e.value).endswith(
        "(top level): the job has no chief and no worker; add e.g. roles: {worker: {count: 1}}"), str(e.value)


def test_two_chiefs_are_an_error():
    with pytest.raises(SpecError, match="one chief"):
        spec_from_dict({"name": "x", "run": "true", "roles": {"chief": {"count": 2}}})


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot read the job spec"):
        load_spec(tmp_path / "nope.yaml")


def test_durations_and_memory_sizes_parse():
    def parse_memory(value):
        return RoleSpec(memory=value).memory

    assert parse_duration("1h") == 3600 and parse_duration(5) == 5.0
    assert parse_memory("512MiB") == 512 * 2**20 and parse_memory("1G") == 10**9
    with pytest.raises(ValueError):
        parse_duration("soon")


@pytest.mark.parametrize("written, said", [("null", "null"), (".nan", "nan"), (".inf", "inf"), ("soon", "'soon'")])
def test_a_duration_that_is_not_one_is_named_as_written(tmp_path, written, said):
    (tmp_path / "job.yaml").write_text(f"name: j\nrun: python t.py\nroles: {{worker: {{}}}}\ngrace_period: {written}\n")
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "job.yaml")
    assert str(e.value).endswith(f"job.yaml:4: grace_period: {said} is not a duration; write e.g. 30s, 10m or 1h")


# --- hostile YAML: aliases and nesting ------------------------------------------------

HEAD = "name: x\nrun: python t.py\nroles: {worker: {}}\n"


def alias_bomb(levels, fanout=10):
    """The classic "billion laughs": each level is a list of `fanout` aliases of the last."""
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, levels):
        aliases = ", ".join([f"*a{level - 1}"] * fanout)
        lines.append(f"a{level}: &a{level} [{aliases}]")
    return "env:\n" + "".join(f"  {line}\n" for line in lines)


@pytest.mark.parametrize("levels", [5, 9])
def test_alias_bomb_is_a_spec_error_before_it_expands(tmp_path, levels):
    text = HEAD + alias_bomb(levels)
    assert len(text) < 1200
    e = error(tmp_path, text)
    assert "alias" in str(e) and e.line is not None


def test_recursive_alias_is_a_spec_error(tmp_path):
    e = error(tmp_path, HEAD + "env: &loop {A: *loop}\n")
    assert "alias" in str(e)


def test_a_few_small_aliases_are_fine(tmp_path):
    text = HEAD.replace("roles: {worker: {}}", "roles:\n  worker: {env: &e {A: '1'}}\n"
                        "  chief: {env: *e}")
    spec = load(tmp_path, text)
    assert spec.role("chief").env == spec.role("worker").env == {"A": "1"}


@pytest.mark.parametrize("opening,closing", [("[", "]"), ("{a: ", "}")])
def test_deep_nesting_is_a_spec_error_not_a_recursion_error(tmp_path, opening, closing):
    e = error(tmp_path, HEAD + "env: " + opening * 5000 + "1" + closing * 5000 + "\n")
    assert "nested" in str(e) and e.line == 4


# --- parameters in the command: one argument each, typed, never shell code ------------


def argv_of(spec):
    from pathlib import Path

    from shoal.launch.executor_local import LocalExecutor
    from shoal.launch.plan import make_plan

    allocation = LocalExecutor(python="/py", gpu_count=0).allocate(spec)
    plan = make_plan(spec, allocation, job_id="x-1", shoal_home=Path("/h"), workdir=Path("/w"),
                     secret="s" * 64)
    return list(plan.tasks[0].argv)


def test_override_with_spaces_is_refused_for_an_int_parameter(tmp_path):
    e = error(tmp_path, GOOD, ["steps=300 --model_dir /tmp/x --learning_rate 50"])
    assert e.field == "--param" and "steps" in str(e) and "integer" in str(e)


@pytest.mark.parametrize("item", ["steps=abc", "steps=3; touch F", "steps=1.5", "steps=true"])
def test_override_not_matching_an_int_parameter_is_refused(tmp_path, item):
    e = error(tmp_path, GOOD, [item])
    assert "steps" in str(e) and "integer" in str(e)


def test_overrides_are_read_as_the_declared_type(tmp_path):
    text = ("name: x\nparameters: {lr: 0.1, flag: false, tag: a}\n"
            "run: [python, t.py, --lr, '{{ lr }}', --flag, '{{ flag }}', --tag, '{{ tag }}']\n"
            "roles: {worker: {}}\n")
    spec = load(tmp_path, text, ["lr=1e-3", "flag=yes", "tag=007"])
    assert argv_of(spec)[1:] == ["t.py", "--lr", "0.001", "--flag", "true", "--tag", "007"]
    for item, word in (("lr=fast", "number"), ("flag=maybe", "true or false")):
        assert word in str(error(tmp_path, text, [item]))


@pytest.mark.parametrize("form", ["string", "list"])
def test_string_parameter_value_is_one_argument(tmp_path, form):
    run = ("python t.py --name {{ name }} --out=/o/{{ name }}" if form == "string" else
           "[python, t.py, --name, '{{ name }}', '--out=/o/{{ name }}']")
    text = f"name: x\nparameters: {{name: a}}\nrun: {run}\nroles: {{worker: {{}}}}\n"
    spec = load(tmp_path, text, ["name=300 --model_dir /tmp/x"])
    assert argv_of(spec) == ["/py", "t.py", "--name", "300 --model_dir /tmp/x",
                             "--out=/o/300 --model_dir /tmp/x"]


def test_parameter_name_that_is_not_a_name_is_an_error(tmp_path):
    e = error(tmp_path, GOOD.replace("  workers: 2", "  on: 2"), ["steps=3"])
    assert e.field == "parameters.True" and e.line == 2 and "not a parameter name" in str(e)


def test_whole_parameter_list_item_becomes_a_string_argument(tmp_path):
    text = ("name: x\nparameters: {mb: 64}\nrun: [python, t.py, --mb, '{{ mb }}', 7]\n"
            "roles: {worker: {}}\n")
    assert argv_of(load(tmp_path, text)) == ["/py", "t.py", "--mb", "64", "7"]


def test_empty_whole_parameter_adds_no_argument(tmp_path):
    text = ("name: x\nparameters: {sync: ''}\nrun: python t.py {{ sync }} --steps 5\n"
            "roles: {worker: {}}\n")
    assert argv_of(load(tmp_path, text)) == ["/py", "t.py", "--steps", "5"]
    assert argv_of(load(tmp_path, text, ["sync=--sync"])) == [
        "/py", "t.py", "--sync", "--steps", "5"]


@pytest.mark.parametrize("run", [
    'sh -c "echo {{ msg }} > out.txt"',
    "[/bin/sh, -ec, 'echo {{ msg }} > out.txt']",
    "env A=1 bash --norc -o pipefail -c 'echo {{ msg }} > out.txt'",
    "sh -c '{{ msg }}' > out.txt",
])
def test_parameter_in_a_shell_script_cannot_run_a_command(tmp_path, run):
    import subprocess

    text = f"name: x\nparameters: {{msg: hi}}\nrun: {run}\nroles: {{worker: {{}}}}\n"
    spec = load(tmp_path, text, ["msg=3; touch F"])
    subprocess.run(argv_of(spec), cwd=tmp_path, timeout=30, capture_output=True)
    assert not (tmp_path / "F").exists()


def test_parameter_in_a_shell_script_is_one_word_of_it(tmp_path):
    import subprocess

    text = ("name: x\nparameters: {msg: hi}\nrun: sh -c 'printf %s {{ msg }} > out.txt'\n"
            "roles: {worker: {}}\n")
    spec = load(tmp_path, text, ["msg=a b'c $(touch F)"])
    subprocess.run(argv_of(spec), cwd=tmp_path, timeout=30, check=True)
    assert (tmp_path / "out.txt").read_text() == "a b'c $(touch F)"
    assert not (tmp_path / "F").exists()


def test_empty_parameter_in_a_shell_script_puts_in_nothing(tmp_path):
    import subprocess

    text = ("name: x\nparameters: {sync: ''}\nrun: sh -c 'printf \"%s|\" \"$@\" > out.txt' sh a {{ sync }} b\n"
            "roles: {worker: {}}\n")
    script = ("name: x\nparameters: {sync: ''}\nrun: sh -c 'set -- a {{ sync }} b; printf \"%s|\" \"$@\" > out.txt'\n"
              "roles: {worker: {}}\n")
    for spec, want in ((load(tmp_path, text), "a|b|"), (load(tmp_path, script), "a|b|"),
                       (load(tmp_path, script, ["sync=--sync"]), "a|--sync|b|")):
        subprocess.run(argv_of(spec), cwd=tmp_path, timeout=30, check=True)
        assert (tmp_path / "out.txt").read_text() == want


@pytest.mark.parametrize("run", ["python t.py --steps {{ steps }", "python t.py --steps {{steps",
                                 "[python, t.py, --steps, '{{ steps }']"])
def test_a_brace_pair_that_opens_no_parameter_reference_is_a_spec_error(tmp_path, run):
    e = error(tmp_path, GOOD.replace("run: python train.py --steps {{ steps }}", f"run: {run}"))
    assert e.field.startswith("run") and "opens no parameter reference" in str(e), str(e)


def test_a_brace_pair_in_a_field_that_opens_no_parameter_reference_is_a_spec_error(tmp_path):
    e = error(tmp_path, GOOD.replace("roles:", "output_dir: out/{{ steps\nroles:"))
    assert e.field == "output_dir" and "opens no parameter reference" in str(e), str(e)


def test_unbalanced_quote_in_command_is_a_spec_error(tmp_path):
    e = error(tmp_path, GOOD.replace("--steps {{ steps }}", "--steps '{{ steps }}"))
    assert e.field == "run" and e.line == 5 and "quot" in str(e)


def test_role_command_is_templated_like_the_job_command(tmp_path):
    text = ("name: x\nparameters: {n: 'a b'}\nrun: python t.py\n"
            "roles: {worker: {run: 'python w.py --n {{ n }}'}}\n")
    assert argv_of(load(tmp_path, text)) == ["/py", "w.py", "--n", "a b"]


# --- memory sizes and role names ------------------------------------------------------


@pytest.mark.parametrize("bad", [True, "10%", "-1", "lots"])
def test_memory_that_is_not_a_size_is_an_error(tmp_path, bad):
    with pytest.raises(SpecError, match="memory"):
        spec_from_dict({"name": "x", "run": "true", "roles": {"worker": {"memory": bad}}})


def test_role_name_is_checked_by_the_spec_model_too():
    from pydantic import ValidationError

    from shoal.launch.spec import JobSpec

    with pytest.raises(ValidationError, match="'pss' is not a role"):
        JobSpec.model_validate({"name": "x", "run": "true", "roles": {"pss": {}}})


@pytest.mark.parametrize("where", ["env: {TF_CONFIG: '{}'}\n", "roles: {worker: {env: {SHOAL_JOB_SECRET: s}}}\n"])
def test_env_may_not_set_what_the_launcher_sets_for_every_task(tmp_path, where):
    text = "name: x\nrun: python t.py\n" + (where if where.startswith("env") else "") + \
        (where if where.startswith("roles") else "roles: {worker: {}}\n")
    e = error(tmp_path, text)
    assert "is set by the launcher for every task" in str(e) and "remove it from env:" in str(e), str(e)


@pytest.mark.parametrize("name, says", [("bad name", "'bad name' is not a job name: use letters, digits"),
                                        ("'7'", "'7' is all digits, and shoal status 7 would mean job number 7")])
def test_a_job_name_that_cannot_be_one_says_why(tmp_path, name, says):
    e = error(tmp_path, f"name: {name}\nrun: python t.py\nroles: {{worker: {{}}}}\n")
    assert e.field == "name" and says in str(e) and "(got" not in str(e), str(e)


def test_watchdog_off_turns_it_off(tmp_path):
    spec = load(tmp_path, "name: x\nrun: python t.py\nroles: {worker: {}}\nwatchdog: off\n")
    assert not spec.watchdog.enabled


def test_a_key_written_twice_in_one_mapping_is_a_spec_error(tmp_path):
    e = error(tmp_path, "name: x\nrun: python t.py\nroles: {worker: {count: 2}}\nname: y\n")
    assert e.line == 4 and "'name' is written twice in the same mapping (first at line 1)" in str(e), str(e)
    e = error(tmp_path, "name: x\nrun: python t.py\nroles:\n  worker: {count: 2, count: 3}\n")
    assert e.line == 4 and "'count' is written twice" in str(e), str(e)
    spec = load(tmp_path, "name: x\nrun: python t.py\nroles:\n  ps: {count: 1}\n  worker: {count: 2}\n"
                          "env: {count: '1'}\n")  # the same key in different mappings is fine
    assert spec.count("worker") == 2


def test_the_jobs_run_may_be_left_out_when_every_role_runs_its_own():
    roles = {"worker": {"count": 2, "run": "python w.py"}, "ps": {"count": 1, "run": "python p.py"},
             "evaluator": {"count": 0}}  # no task: no command needed
    spec = spec_from_dict({"name": "j", "roles": roles}, source="job.yaml")
    assert spec.run is None and spec.role("ps").run == "python p.py"


def test_a_role_with_tasks_and_no_command_of_a_job_without_run_is_named():
    roles = {"worker": {"count": 2, "run": "python w.py"}, "ps": {"count": 1}}
    with pytest.raises(SpecError, match=r"^job.yaml: roles.ps.run: is missing, and so is the job's run: \(the "
                                        r"command of every role without its own\); add run: at the top, or one to "
                                        r"roles.ps$"):
        spec_from_dict({"name": "j", "roles": roles}, source="job.yaml")


def test_a_role_that_may_get_tasks_needs_a_command_too():
    roles = {"chief": {"run": "python c.py"}, "worker": {"count": "0..2"}}
    with pytest.raises(SpecError, match="roles.worker.run: is missing"):
        spec_from_dict({"name": "j", "roles": roles}, source="job.yaml")


def test_a_job_with_no_command_anywhere_is_told_to_add_run():
    with pytest.raises(SpecError, match=r"^job.yaml: run: is missing; add it \(or give every role its own run:\)$"):
        spec_from_dict({"name": "j", "roles": {"worker": {"count": 1}}}, source="job.yaml")


def test_a_duration_below_its_bound_gives_a_duration_as_the_example():
    data = {"name": "j", "run": "python t.py", "roles": {"worker": {"count": 1}}, "ssh": {"connect_timeout": "0s"}}
    with pytest.raises(SpecError, match=r"^job.yaml: ssh.connect_timeout: must be more than 0; give e.g. "
                                        r"connect_timeout: 10s$"):
        spec_from_dict(data, source="job.yaml")
