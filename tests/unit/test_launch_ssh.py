"""The SSH executor's pure parts: ssh and rsync argvs, the agent's command line, the one line per
bad host, TaskRefs that carry how to reach a host, the per-host dry run, and which executor a job
gets."""

import argparse
import io
import shlex
from pathlib import Path

import pytest

from shoal.cli.environment import Environment
from shoal.cli.executors import executor_for, forwarded, recorded_executor
from shoal.cli.main import main
from shoal.cluster import TaskId
from shoal.launch.allocation import Allocation, TaskAllocation
from shoal.launch.errors import LaunchError
from shoal.launch.executor import TaskRef
from shoal.launch.executor_local import LocalExecutor
from shoal.launch.executor_ssh import SshExecutor
from shoal.launch.plan import HIDDEN_SECRET, format_plan, make_plan
from shoal.launch.spec import spec_from_dict
from shoal.launch.ssh import NO_PYTHON, NO_WORKDIR, SshOptions, agent_command, ssh_argv
from shoal.launch.ssh_control import AgentSite
from shoal.launch.ssh_preflight import explain, ssh_problem
from shoal.launch.ssh_sync import rsync_argv

SECRET = "5ec7e7" * 10


def test_ssh_argv_never_prompts_bounds_the_connect_and_ends_options_before_the_host():
    argv = ssh_argv("node1", "true", SshOptions(config="/c/ssh_config", connect_timeout=4.5, heartbeat=10))
    assert argv[:3] == ["ssh", "-F", "/c/ssh_config"]
    for option in ("BatchMode=yes", "ConnectTimeout=5", "ServerAliveInterval=5", "ServerAliveCountMax=3"):
        assert argv[argv.index(option) - 1] == "-o"
    assert argv[-3:] == ["--", "node1", "true"]
    assert "-F" not in ssh_argv("node1", "true", SshOptions())


def test_agent_command_checks_workdir_and_interpreter_then_runs_the_agent():
    line = agent_command("/opt/py env/bin/python", "/w d", {"PYTHONPATH": "/w d"}, ["--heartbeat", "10"])
    sh, c, script = shlex.split(line)
    assert (sh, c) == ("sh", "-c")
    assert f"exit {NO_WORKDIR}" in script and f"exit {NO_PYTHON}" in script
    assert script.endswith("exec env 'PYTHONPATH=/w d' '/opt/py env/bin/python' -m shoal.launch.agent"
                           " --heartbeat 10")


@pytest.mark.parametrize("code, stderr, expected", [
    (255, "root@10.0.0.3: Permission denied (publickey).", "h: ssh refused the login (root@10.0.0.3: Permission"),
    (255, "ssh: connect to host 10.0.0.3 port 22: Connection timed out", "h: unreachable (ssh: connect"),
    (255, "ssh: connect to host 10.0.0.3 port 22: No route to host", "h: unreachable"),
    (255, "ssh: Could not resolve hostname h: Name or service not known", "h: unknown host name"),
    (255, "Host key verification failed.", "h: its host key is not known here"),
    (NO_WORKDIR, "no directory /w", "h: no directory /w there; use the same paths on every host, or set sync"),
    (NO_PYTHON, "no interpreter /py", "h: no interpreter /py there"),
    (1, "/py: No module named shoal", "h: /py cannot import Shoal there (/py: No module named shoal); install Shoal 9"),
    (None, "", "h: no answer within 30s"),
])
def test_each_kind_of_bad_host_gets_one_line_that_says_what_to_do(code, stderr, expected):
    line = explain("h", code, stderr, python="/py", workdir="/w", version="9", waited=30)
    assert line.startswith(expected) and "\n" not in line


RSYNC_TRAILER = "rsync: connection unexpectedly closed (0 bytes received so far) [sender]\n" \
                "rsync error: unexplained error (code 255) at io.c(285) [sender=3.5.0]"


CHANGED_KEY = """\
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Add correct host key in /tmp/k/known_hosts to get rid of this message.
Offending ED25519 key in /tmp/k/known_hosts:1
  remove with:
  ssh-keygen -f "/tmp/k/known_hosts" -R "10.213.91.2"
Host key for 10.213.91.2 has changed and you have requested strict checking.
Host key verification failed."""


def test_a_changed_host_key_is_told_apart_from_an_unknown_one_and_names_how_to_remove_the_old():
    line = ssh_problem("host1", CHANGED_KEY, config="/tmp/k/ssh_config")
    assert line.startswith("host1: its host key has changed since it was last accepted (Host key for 10.213.91.2 "
                           "has changed and you have requested strict checking.); if the machine was reinstalled, "
                           "remove the old key (ssh-keygen -f \"/tmp/k/known_hosts\" -R \"10.213.91.2\") and run "
                           "`ssh -F /tmp/k/ssh_config host1` once"), line
    assert "WARNING" not in line and "\n" not in line
    older = ("@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nOffending ECDSA key in /k/known_hosts:3\n"
             "ECDSA host key for node1 has changed and you have requested strict checking.\n"
             "Host key verification failed.")  # an ssh that says no "remove with:"
    line = ssh_problem("node1", older)
    assert line.startswith("node1: its host key has changed since it was last accepted (ECDSA host key for node1 has")
    assert "remove the old key (ssh-keygen -f /k/known_hosts -R node1)" in line, line
    unknown = ssh_problem("host1", "No ED25519 host key is known for 10.213.91.2 and you have requested strict "
                                   "checking.\nHost key verification failed.")
    assert unknown.startswith("host1: its host key is not known here (No ED25519 host key is known for 10.213.91.2")


@pytest.mark.parametrize("ssh_said, expected", [
    ("root@10.0.0.3: Permission denied (publickey).", "h: ssh refused the login (root@10.0.0.3: Permission denied"),
    ("Host key verification failed.", "h: its host key is not known here (Host key verification failed.)"),
    ("ssh: connect to host 10.0.0.3 port 22: No route to host", "h: unreachable (ssh: connect to host 10.0.0.3"),
])
def test_an_ssh_failure_under_rsync_quotes_ssh_and_not_rsyncs_trailer(ssh_said, expected):
    line = ssh_problem("h", f"{ssh_said}\n{RSYNC_TRAILER}")
    assert line.startswith(expected) and "rsync error" not in line


def test_the_fixes_named_for_a_host_use_the_jobs_ssh_config():
    refused = explain("node2", 255, "Permission denied (publickey).", python="/py", workdir="/w", version="9",
                      waited=30, config="/c/my cfg")
    assert "(ssh-copy-id -F '/c/my cfg' node2)" in refused
    unknown = ssh_problem("node2", "Host key verification failed.", "/c/cfg")
    assert "run `ssh -F /c/cfg node2` once" in unknown
    assert "run `ssh node2` once" in ssh_problem("node2", "Host key verification failed.")


def test_rsync_goes_over_the_same_ssh_and_makes_the_directory_there():
    argv = rsync_argv("node2", "/w/proj", SshOptions(config="/c/cfg"))
    assert argv[0] == "rsync" and argv[-2:] == ["/w/proj/", "node2:/w/proj/"]
    assert shlex.split(argv[argv.index("-e") + 1])[:3] == ["ssh", "-F", "/c/cfg"]
    assert argv[argv.index("--rsync-path") + 1] == "mkdir -p /w/proj/ && rsync"


def test_a_task_ref_carries_how_to_reach_its_host_through_the_records():
    site = AgentSite("node2", "/py", "/w", (("PYTHONPATH", "/w"),), "/c/cfg")
    ref = TaskRef("ssh", pid=42, started=1.5, host="node2", extra=(("job", "j-1"), *site.to_extra()))
    again = TaskRef.from_json(ref.to_json())
    assert AgentSite.from_ref(again) == site and dict(again.extra)["job"] == "j-1"
    assert again.describe() == "pid 42 on node2"


def remote_plan():
    spec = spec_from_dict({"name": "m", "run": "python t.py", "roles": {"ps": {"count": 1}, "worker": {"count": 2}}})
    places = (TaskAllocation(TaskId("ps", 0), "10.0.0.2", 2222, node="h1"),
              TaskAllocation(TaskId("worker", 0), "10.0.0.3", 2222, node="h2"),
              TaskAllocation(TaskId("worker", 1), "10.0.0.2", 2223, node="h1"))
    allocation = Allocation(places, "10.0.0.3", 2224, "/py", env=(("PYTHONPATH", "/w"),))
    return make_plan(spec, allocation, job_id="m-1", shoal_home=Path("/h"), workdir=Path("/w"), secret=SECRET)


def test_dry_run_of_a_job_on_hosts_groups_tasks_by_host_and_hides_the_secret():
    text = format_plan(remote_plan())
    assert text.index("## on h1: ps.0, worker.1") < text.index("# m.ps.0  10.0.0.2:2222") \
        < text.index("# m.worker.1  10.0.0.2:2223") < text.index("## on h2: worker.0") \
        < text.index("# m.worker.0  10.0.0.3:2222")
    assert SECRET not in text and HIDDEN_SECRET in text
    assert "PYTHONPATH=/w" in text and "MASTER_ADDR=10.0.0.3" in text


def test_tasks_on_hosts_keep_their_host_and_get_the_forwarded_variables_first():
    plan = remote_plan()
    assert [t.node for t in plan.tasks] == ["h1", "h2", "h1"]
    assert list(plan.tasks[0].env_dict)[0] == "PYTHONPATH"


def test_only_python_variables_of_the_launcher_are_forwarded():
    assert forwarded({"PYTHONPATH": "/w", "HOME": "/root", "SHOAL_JOB_SECRET": SECRET}) == {"PYTHONPATH": "/w"}


def env_of(tmp_path):
    return Environment(environ={"SHOAL_HOME": str(tmp_path)}, stdout=io.StringIO(), stderr=io.StringIO(),
                       stdout_bytes=io.BytesIO(), cwd=tmp_path)


def args(**kw):
    return argparse.Namespace(**{"hosts": None, "hostfile": None, "ssh_config": None, **kw})


def test_localhost_alone_or_no_hosts_runs_on_the_local_executor_and_others_over_ssh(tmp_path):
    spec = spec_from_dict({"name": "m", "run": "python t.py", "roles": {"worker": {"count": 1}}})
    env = env_of(tmp_path)
    assert isinstance(executor_for(spec, args(), env), LocalExecutor)
    assert isinstance(executor_for(spec, args(hosts="localhost"), env), LocalExecutor)
    assert isinstance(executor_for(spec, args(hosts="node1,node2"), env), SshExecutor)
    (tmp_path / "hosts.txt").write_text("localhost slots=4\n")
    assert isinstance(executor_for(spec, args(hostfile="hosts.txt"), env), LocalExecutor)
    on_hosts = spec_from_dict({"name": "m", "run": "python t.py", "roles": {"worker": {"count": 1}},
                               "hosts": ["node1"]})
    assert isinstance(executor_for(on_hosts, args(), env), SshExecutor)
    assert isinstance(executor_for(on_hosts, args(hosts="localhost"), env), LocalExecutor)  # flags win


def test_recorded_jobs_reach_their_executor_kind_and_an_unknown_kind_is_refused(tmp_path):
    env = env_of(tmp_path)
    assert recorded_executor("ssh", env).kind == "ssh" and recorded_executor("local", env).kind == "local"
    assert recorded_executor("slurm", env).kind == "slurm"
    with pytest.raises(LaunchError, match="'kubernetes' executor, which this shoal does not know"):
        recorded_executor("kubernetes", env)


def test_hosts_and_hostfile_together_are_a_usage_error(tmp_path):
    env = env_of(tmp_path)
    assert main(["run", "--hosts", "a", "--hostfile", "f", "--", "python", "t.py"], env) == 2


def test_a_missing_hostfile_is_a_spec_error_naming_it(tmp_path):
    env = env_of(tmp_path)
    assert main(["run", "--hostfile", "nope.txt", "--", "python", "t.py"], env) == 3
    assert "nope.txt: cannot read the hostfile" in env.stderr.getvalue()
