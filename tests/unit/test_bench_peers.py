"""bench's pure parts: the peers' interleaving plan, the figures of a run, the ratios; the job
runner's task environment and the sampled series."""

import subprocess

import pytest

from bench.jobrun import Task, clean_env
from bench.peers import metrics, report, systems
from bench.peers.__main__ import pair_sequence
from bench.peers.runner import JobRecord
from bench.usage import interpolate


def test_pair_sequence_puts_every_peer_next_to_its_shoal_mode_and_rotates():
    first, second = pair_sequence(list(systems.SYSTEMS), 0), pair_sequence(list(systems.SYSTEMS), 1)
    assert ("shoal-async", "tf1-async") in first and ("shoal-sync", "torch-ddp") in first
    assert ("shoal-sync", "nocomm") in first
    assert len(first) == 10 and second == first[1:] + first[:1]  # 7 peers + the coordinator's 3 pairs


def test_pair_sequence_puts_the_coordinator_next_to_tf2_at_its_dispatch_size_and_to_shoal_async():
    pairs = pair_sequence(list(systems.SYSTEMS), 0, "softmax")
    assert ("shoal-coord-k1", "tf2-ps-k1") in pairs and ("shoal-coord-k10", "tf2-ps-k10") in pairs
    assert ("shoal-coord-k10", "shoal-async") in pairs and ("shoal-async", "tf2-ps-k10") in pairs


def test_pair_sequence_leaves_out_a_system_that_cannot_train_the_model():
    pairs = pair_sequence(["shoal-async", "tf2-ps-k1", "shoal-coord-k1"], 0, "mlp")
    assert pairs == [("shoal-async", "tf2-ps-k1")]


def test_pair_sequence_runs_a_coordinator_alone_when_none_of_its_references_is_selected():
    assert pair_sequence(["shoal-coord-k10"], 0, "softmax") == [("shoal-coord-k10", None)]


def test_build_refuses_a_model_the_coordinator_example_does_not_train():
    ctx = systems.Context("python", None, "/nowhere", 10)
    with pytest.raises(ValueError, match="shoal-coord-k10 cannot train model 'mlp'"):
        systems.build(systems.SYSTEMS["shoal-coord-k10"], "mlp", 1000, ctx)


def test_build_runs_the_coordinator_as_chief_with_ps_and_workers_that_all_exit():
    ctx = systems.Context("python", None, "/nowhere", 10)
    spec = systems.build(systems.SYSTEMS["shoal-coord-k10"], "softmax", 60_000, ctx)
    assert [t.name for t in spec.tasks] == ["ps:0", "ps:1", "worker:0", "worker:1", "chief:0"]
    assert all(t.end is systems.End.EXITS for t in spec.tasks)
    assert spec.steps == 600 and spec.line_examples == 1000
    assert spec.tasks[-1].argv[:1] == ("examples/mnist_coordinator.py",)
    assert spec.tasks[-1].argv[spec.tasks[-1].argv.index("--steps_per_dispatch") + 1] == "10"


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


def test_measure_counts_a_coordinator_line_as_its_dispatch_of_k_batches():
    ctx = systems.Context("python", None, "/nowhere", 10)
    spec = systems.build(systems.SYSTEMS["shoal-coord-k10"], "softmax", 20_000, ctx)
    lines = {"chief:0": [(10.0 + i * 0.1, f"chief:0 step={10 * (i + 1)} loss=0.5 examples/s=9000") for i in range(20)]
             + [(13.0, "accuracy: 0.9100")]}
    tasks = []
    for ts in spec.tasks:
        proc = subprocess.Popen.__new__(subprocess.Popen)  # never started: only a name holder here
        task = Task(ts.name, proc, lines=lines.get(ts.name, []))
        task.usage.cpu = [(0.0, 0.0), (100.0, 50.0)]
        tasks.append(task)
    record = JobRecord(spec, tasks, {t.name: 0 for t in tasks}, launched=0.0, ended=20.0,
                       machine_cpu=[(0.0, 0.0), (100.0, 100.0)])
    run = metrics.measure(record)
    assert run["ok"] and run["window_examples"] % 1000 == 0
    assert abs(run["examples_per_s"] - 1000 / 0.1) / 10_000 < 0.05  # 10 batches of 100 every 0.1 s


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


def test_markdown_lists_the_coordinator_s_ratios_with_their_goals():
    runs = [{"system": s, "model": "softmax", "ok": True, "examples_per_s": e}
            for s, e in (("shoal-coord-k10", 90), ("tf2-ps-k10", 20), ("shoal-async", 100))]
    ratio_rows = report.ratios(runs, [{"shoal": 0, "peer": 1}, {"shoal": 0, "peer": 2}])
    table = report.markdown([], ratio_rows, [], [], {}, {})
    assert "| shoal-coord-k10 | tf2-ps-k10 | softmax | 4.50x (4.50) | >= 3: met |" in table
    assert "| shoal-coord-k10 | shoal-async | softmax | 0.90x (0.90) | >= 0.8: met |" in table


def test_clean_env_drops_another_job_s_settings_and_adds_the_task_s():
    base = {"PATH": "/bin", "SHOAL_JOB_SECRET": "theirs", "TF_CONFIG": "{}", "OUTPUT_DIR": "/out", "MASTER_PORT": "1"}
    env = clean_env(base, {"SHOAL_JOB_SECRET": "ours"})
    assert env == {"PATH": "/bin", "SHOAL_JOB_SECRET": "ours", "PYTHONUNBUFFERED": "1"}
    assert base["SHOAL_JOB_SECRET"] == "theirs"  # the benchmark's own environment is left alone


def test_interpolate_reads_a_sampled_series_between_and_outside_its_samples():
    series = [(1.0, 10.0), (3.0, 30.0)]
    assert [interpolate(series, t) for t in (0.0, 2.0, 5.0)] == [10.0, 20.0, 30.0]
    assert interpolate([], 1.0) == 0.0
