"""bench's pure parts: the peers' interleaving plan, the figures of a run, the ratios; the job
runner's task environment and the sampled series."""

import subprocess

from bench.jobrun import Task, clean_env
from bench.peers import metrics, report, systems
from bench.peers.__main__ import pair_sequence
from bench.peers.runner import JobRecord
from bench.usage import interpolate


def test_pair_sequence_puts_every_peer_next_to_its_shoal_mode_and_rotates():
    first, second = pair_sequence(list(systems.SYSTEMS), 0), pair_sequence(list(systems.SYSTEMS), 1)
    assert ("shoal-async", "tf1-async") in first and ("shoal-sync", "torch-ddp") in first
    assert ("shoal-sync", "nocomm") in first
    assert len(first) == 7 and second == first[1:] + first[:1]


def test_pair_sequence_runs_shoal_alone_when_no_peer_is_selected():
    assert pair_sequence(["shoal-async"], 0) == [("shoal-async", None)]


def _record(lines_by_task: dict, ends=None) -> JobRecord:
    ctx = systems.Context("python", "python", "/nowhere", 10)
    spec = systems.build(systems.SYSTEMS["tf1-async"], "softmax", 1000, ctx)
    tasks = []
    for ts in spec.tasks:
        proc = subprocess.Popen.__new__(subprocess.Popen)  # never started: only a name holder here
        task = Task(ts.name, proc, lines=lines_by_task.get(ts.name, []))
        task.usage.cpu = [(0.0, 0.0), (100.0, 50.0)]
        tasks.append(task)
    codes = {t.name: (0 if t.name.startswith("worker") else None) for t in tasks}
    return JobRecord(spec, tasks, codes, launched=0.0, ended=20.0, machine_cpu=[(0.0, 0.0), (100.0, 100.0)])


def test_measure_counts_examples_while_every_worker_trains_and_finds_the_step_to_090():
    w0 = [(10.0 + i * 0.1, 2 * i, 100) for i in range(20)]
    w1 = [(10.05 + i * 0.1, 2 * i + 1, 100) for i in range(20)]
    lines = {"worker:0": [(t, f"step={s} examples={e}") for t, s, e in w0]
             + [(12.0, "eval_step=10 accuracy=0.8500 eval_s=0.0100"), (12.1, "eval_step=20 accuracy=0.9100 eval_s=0.0100"),
                (13.0, "accuracy: 0.9200")],
             "worker:1": [(t, f"step={s} examples={e}") for t, s, e in w1]}
    run = metrics.measure(_record(lines))
    assert run["ok"] and run["accuracy"] == 0.92 and run["s90"] == 20
    assert run["first_step_s"] == 10.05
    assert run["time_to_090_s"] == 11.0  # worker:0's line of step 20 arrived at 11.0
    # window: from worker:1's 3rd line (10% warm-up of 20 = line 2) to worker:1's... earliest last line
    assert run["window_s"] == round(11.9 - 10.25, 3)
    assert abs(run["examples_per_s"] - 2 * 100 / 0.1) / 2000 < 0.05
    assert run["cpu_s_per_1k_examples"] > 0


def test_measure_fails_a_run_whose_worker_exited_nonzero():
    record = _record({"worker:0": [(1.0, "step=1 examples=100")]})
    record.codes["worker:1"] = 1
    assert not metrics.measure(record)["ok"]


def test_ratios_take_the_median_over_pairs_and_judge_the_goal_on_the_softmax():
    runs = [{"system": "shoal-async", "model": "softmax", "ok": True, "examples_per_s": e} for e in (90, 60, 30)]
    runs += [{"system": "tf1-async", "model": "softmax", "ok": True, "examples_per_s": e} for e in (30, 30, 30)]
    pairs = [{"shoal": i, "peer": i + 3} for i in range(3)]
    (row,) = report.ratios(runs, pairs)
    assert (row["ratio"], row["goal"], row["goal_met"]) == (2.0, 3.0, False)


def test_clean_env_drops_another_job_s_settings_and_adds_the_task_s():
    base = {"PATH": "/bin", "SHOAL_JOB_SECRET": "theirs", "TF_CONFIG": "{}", "OUTPUT_DIR": "/out", "MASTER_PORT": "1"}
    env = clean_env(base, {"SHOAL_JOB_SECRET": "ours"})
    assert env == {"PATH": "/bin", "SHOAL_JOB_SECRET": "ours", "PYTHONUNBUFFERED": "1"}
    assert base["SHOAL_JOB_SECRET"] == "theirs"  # the benchmark's own environment is left alone


def test_interpolate_reads_a_sampled_series_between_and_outside_its_samples():
    series = [(1.0, 10.0), (3.0, 30.0)]
    assert [interpolate(series, t) for t in (0.0, 2.0, 5.0)] == [10.0, 20.0, 30.0]
    assert interpolate([], 1.0) == 0.0
