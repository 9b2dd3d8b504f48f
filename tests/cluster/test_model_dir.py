"""One job per model dir, and a periodic checkpoint or a summary that fails to write does not stop
training (W2)."""

import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import shoal
from shoal.train.checkpoint import CheckpointError, CheckpointWriteError
from shoal.train.model_dir_lock import ModelDirLockedError
from tests.small_disk import small_disk  # noqa: F401  (a fixture)


def chief_session(local, model_dir, every_steps=None, summary_every_steps=100):
    return shoal.TrainingSession(local.config, {"w": np.zeros(4, np.float32)}, shoal.SGD(0.1), secret=local.secret,
                                 model_dir=model_dir, request_timeout_s=10, summary_every_steps=summary_every_steps,
                                 checkpoints=shoal.CheckpointOptions(every_steps=every_steps, every_s=None))


def test_second_job_on_the_same_model_dir_is_refused_naming_the_dir(tmp_path):
    with shoal.create_local_server() as first_job, shoal.create_local_server() as second_job:
        with chief_session(first_job, tmp_path / "model"):
            second = chief_session(second_job, tmp_path / "model")
            with pytest.raises(ModelDirLockedError, match=str(tmp_path / "model")):
                second.start()
            assert second.state is shoal.SessionState.NEW
        with chief_session(second_job, tmp_path / "model") as after:  # free again once the first closed
            assert after.global_step == 0


def test_failed_periodic_checkpoint_warns_and_training_goes_on(tmp_path, caplog):
    model_dir = tmp_path / "model"
    with shoal.create_local_server() as local:
        chief = chief_session(local, model_dir, every_steps=2).start()
        for _ in range(2):
            chief.push({"w": np.ones(4, np.float32)})
        assert (model_dir / "checkpoints" / "ckpt-0000000002").is_dir()
        shutil.rmtree(model_dir / "checkpoints")
        (model_dir / "checkpoints").write_text("not a directory")  # every later save fails
        with caplog.at_level(logging.WARNING, logger="shoal.train.session"):
            for _ in range(4):
                result = chief.push({"w": np.ones(4, np.float32)})
        assert result.global_step == 6
        warnings = [r.getMessage() for r in caplog.records if "could not save a periodic checkpoint" in r.getMessage()]
        assert len(warnings) == 2, warnings  # steps 4 and 6: tried again at the next interval, not every step
        with pytest.raises(CheckpointError):
            chief.save_checkpoint()  # an explicit (or the final) save still fails loudly
        chief.close()


def test_a_model_dir_removed_mid_run_is_not_written_again_and_another_job_may_take_it(tmp_path, caplog):
    model_dir = tmp_path / "model"
    with shoal.create_local_server() as local, shoal.create_local_server() as other:
        chief = chief_session(local, model_dir, every_steps=2).start()
        chief.push({"w": np.ones(4, np.float32)})
        shutil.rmtree(model_dir)  # by hand, mid-run
        with caplog.at_level(logging.WARNING, logger="shoal.train.session"):
            for _ in range(3):
                chief.push({"w": np.ones(4, np.float32)})
        assert not (model_dir / "checkpoints").exists()  # not made again behind the user's back
        warnings = [r.getMessage() for r in caplog.records if "could not save a periodic checkpoint" in r.getMessage()]
        assert len(warnings) == 2 and f"{model_dir}/.shoal.lock is gone" in warnings[0], warnings  # steps 2 and 4
        with pytest.raises(CheckpointWriteError, match="this job no longer holds it"):
            chief.save_checkpoint()
        with chief_session(other, model_dir) as second:  # the dir is free for another job, which owns it now
            assert second.global_step == 0
        chief.close()


def test_summaries_on_a_full_disk_warn_once_and_training_goes_on(small_disk, caplog):
    model_dir = small_disk.path / "model"
    with shoal.create_local_server() as local:
        chief = chief_session(local, model_dir, summary_every_steps=1).start()
        small_disk.fill()
        results = []
        train = threading.Thread(target=lambda: results.extend(chief.push({"w": np.ones(4, np.float32)})
                                                               for _ in range(600)), daemon=True)
        with caplog.at_level(logging.WARNING, logger="shoal.train.event_file"):
            train.start()
            train.join(60)  # a push blocked on the summaries would hang here for good
            assert not train.is_alive(), f"training stopped at step {len(results)} of 600"
            small_disk.free()
            chief.close()
        assert results[-1].global_step == 600
        stopped = [r.getMessage() for r in caplog.records if "stopped" in r.getMessage()]
        assert stopped == [f"summaries to {model_dir} stopped: No space left on device; training goes on, and a new "
                           "event file is tried every 60s (free the disk or fix the directory; values meanwhile are "
                           "dropped)"]


def test_the_final_save_says_so_when_a_periodic_save_wrote_that_step_already(tmp_path, caplog):
    with shoal.create_local_server() as local:
        with caplog.at_level(logging.INFO, logger="shoal.train.session"):
            with chief_session(local, tmp_path / "model", every_steps=2) as chief:
                for _ in range(2):
                    chief.push({"w": np.ones(4, np.float32)})  # step 2: a periodic save
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(f"checkpoint step=2 is in {tmp_path / 'model' / 'checkpoints' / 'ckpt-0000000002'} already (final)"
               in line for line in said), said


@pytest.mark.parametrize("example", ["examples/mnist_softmax.py", "examples/mnist_coordinator.py"])
def test_an_example_whose_model_dir_another_job_holds_says_so_without_a_traceback(tmp_path, example):
    import json
    import os
    import subprocess
    import sys

    from shoal.train.model_dir_lock import ModelDirLock

    env = dict(os.environ, SHOAL_JOB_SECRET="ab" * 16, TF_CONFIG=json.dumps({  # (no ps needed: the lock comes first)
        "cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}))
    with ModelDirLock(tmp_path / "model"):  # the other job
        out = subprocess.run([sys.executable, example, "--model_dir", str(tmp_path / "model"), "--steps", "10"],
                             env=env, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith(f"{os.path.basename(example)}: model dir {tmp_path / 'model'} is in use by another"
                                 " job (pid"), out.stderr[-2000:]
    assert "Traceback" not in out.stderr
