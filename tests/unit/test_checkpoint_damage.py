"""Damaged checkpoints: never shadow good ones, never cause good ones to be pruned, never crash."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shoal.train.checkpoint as checkpoint
from shoal.train.checkpoint import (CheckpointError, list_checkpoints, load_latest_checkpoint, read_checkpoint,
                                    save_checkpoint)
from tests.unit.test_checkpoint_files import ADAM, _model, _save

LOGGER = "shoal.train.checkpoint"


def _cut_one_byte(path, name="variables.safetensors"):
    os.truncate(path / name, (path / name).stat().st_size - 1)
    return path


def _names(paths):
    return [p.name for p in paths]


def _damaged(model_dir):
    return sorted(p.name for p in (model_dir / "checkpoints").glob("damaged-*"))


def test_pruning_keeps_the_checkpoint_just_written_when_every_newer_one_is_damaged(tmp_path):
    for step in (10, 20, 30, 40, 50):
        _cut_one_byte(_save(tmp_path, step))
    written = _save(tmp_path, 5)
    assert written.is_dir()
    assert load_latest_checkpoint(tmp_path).step == 5


def test_restart_after_every_checkpoint_was_damaged_keeps_what_it_saves_since(tmp_path):
    """The issue's sequence: all damaged, start from 0, save lower steps, restart from those."""
    for step in (10, 20, 30, 40, 50):
        _cut_one_byte(_save(tmp_path, step))
    assert load_latest_checkpoint(tmp_path) is None
    _save(tmp_path, 3)
    _save(tmp_path, 6)
    assert _names(list_checkpoints(tmp_path)) == ["ckpt-0000000003", "ckpt-0000000006"]
    assert load_latest_checkpoint(tmp_path).step == 6


def test_pruning_keeps_the_newest_k_checkpoints_that_verify(tmp_path):
    for step in (10, 20, 30):
        _save(tmp_path, step)
    _cut_one_byte(list_checkpoints(tmp_path)[-1])
    _save(tmp_path, 40, keep=2)
    assert _names(list_checkpoints(tmp_path)) == ["ckpt-0000000020", "ckpt-0000000040"]


def test_pruning_moves_a_damaged_checkpoint_aside_with_a_warning(tmp_path, caplog):
    for step in (10, 20):
        _save(tmp_path, step)
    _cut_one_byte(list_checkpoints(tmp_path)[-1], "optimizer.safetensors")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _save(tmp_path, 30)
    assert _damaged(tmp_path) == ["damaged-ckpt-0000000020"]
    kept = tmp_path / "checkpoints" / "damaged-ckpt-0000000020"
    assert {p.name for p in kept.iterdir()} == {"variables.safetensors", "optimizer.safetensors", "manifest.json"}
    assert "ckpt-0000000020" in caplog.text and str(kept) in caplog.text


def test_loading_moves_a_damaged_checkpoint_aside_with_a_warning(tmp_path, caplog):
    _save(tmp_path, 10)
    _cut_one_byte(_save(tmp_path, 20))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_latest_checkpoint(tmp_path).step == 10
    assert _names(list_checkpoints(tmp_path)) == ["ckpt-0000000010"]
    assert _damaged(tmp_path) == ["damaged-ckpt-0000000020"]
    assert "skipping damaged checkpoint" in caplog.text and "damaged-ckpt-0000000020" in caplog.text


def test_damaged_checkpoint_of_a_step_moved_aside_before_gets_its_own_name(tmp_path):
    _cut_one_byte(_save(tmp_path, 10))
    assert load_latest_checkpoint(tmp_path) is None
    _cut_one_byte(_save(tmp_path, 10))
    assert load_latest_checkpoint(tmp_path) is None
    assert len(_damaged(tmp_path)) == 2


def test_no_verifying_checkpoint_but_damaged_ones_is_an_error_naming_them(tmp_path, caplog):
    for step in (10, 20):
        _cut_one_byte(_save(tmp_path, step))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_latest_checkpoint(tmp_path) is None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "damaged-ckpt-0000000010" in errors[0] and "damaged-ckpt-0000000020" in errors[0]
    assert "step 0" in errors[0]


def test_damaged_checkpoints_moved_aside_earlier_are_still_an_error(tmp_path, caplog):
    _cut_one_byte(_save(tmp_path, 10))
    load_latest_checkpoint(tmp_path)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert load_latest_checkpoint(tmp_path) is None
    assert "damaged-ckpt-0000000010" in caplog.text


def test_empty_model_dir_logs_no_error(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_latest_checkpoint(tmp_path) is None
    assert not caplog.records


def test_pruning_does_not_verify_checkpoints_this_process_wrote_again(tmp_path, monkeypatch):
    for step in (10, 20, 30):
        _save(tmp_path, step)
    verified = []
    real = checkpoint.verify_checkpoint
    monkeypatch.setattr(checkpoint, "verify_checkpoint", lambda path: (verified.append(path), real(path))[1])
    _save(tmp_path, 40)
    _save(tmp_path, 50)
    assert verified == []


def test_pruning_verifies_checkpoints_of_another_process_once(tmp_path, monkeypatch):
    code = ("import sys; from tests.unit.test_checkpoint_files import _save; from pathlib import Path\n"
            "for step in (10, 20, 30): _save(Path(sys.argv[1]), step)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    verified = []
    real = checkpoint.verify_checkpoint
    monkeypatch.setattr(checkpoint, "verify_checkpoint", lambda path: (verified.append(path.name), real(path))[1])
    _save(tmp_path, 40, keep=3)
    assert sorted(verified) == ["ckpt-0000000020", "ckpt-0000000030"]
    _save(tmp_path, 50, keep=3)
    assert sorted(verified) == ["ckpt-0000000020", "ckpt-0000000030"]


def _rewrite_manifest(path, change):
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


WRONG_SHAPES = {
    "files is a list": lambda m: m.update(files=[]),
    "no step": lambda m: m.pop("step"),
    "step is text": lambda m: m.update(step="ten"),
    "step is negative": lambda m: m.update(step=-1),
    "a file entry is text": lambda m: m["files"].update({"variables.safetensors": "abc"}),
    "a file has no sha256": lambda m: m["files"]["optimizer.safetensors"].pop("sha256"),
    "optimizer is text": lambda m: m.update(optimizer="adam"),
    "variables is a list": lambda m: m.update(variables=[]),
    "a variable is missing": lambda m: m["variables"].pop("b"),
    "a shape is wrong": lambda m: m["variables"]["b"].update(shape=[5]),
    "slots name another variable": lambda m: m.update(slots={"c": ["m"]}),
}


@pytest.mark.parametrize("change", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
def test_manifest_of_the_wrong_shape_is_skipped_as_damage(tmp_path, caplog, change):
    _save(tmp_path, 10)
    _rewrite_manifest(_save(tmp_path, 20), change)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert load_latest_checkpoint(tmp_path).step == 10
    assert "skipping damaged checkpoint" in caplog.text and "ckpt-0000000020" in caplog.text


def test_manifest_of_the_wrong_shape_is_refused_naming_the_field(tmp_path):
    path = _save(tmp_path, 10)
    _rewrite_manifest(path, lambda m: m.update(files=[]))
    with pytest.raises(CheckpointError, match="files"):
        read_checkpoint(path)


# the lease book of a job that consumed 50000 of epoch 0's 60000 positions (MNIST's, as docs/dynamic-sharding.md)
LEASES = {"version": 1, "num_examples": 60000, "seed": 0, "next_epoch": 1, "completed": 0, "requeued": 0, "lost": 0,
          "epochs": [{"epoch": 0, "consumed": [[0, 50000]], "requeued": 0, "lost": 0}]}


def _save_with_leases(tmp_path, step):
    variables, slots = _model(step)
    return save_checkpoint(tmp_path, step, variables, slots, optimizer=ADAM, mode="async", leases=LEASES)


REFUSED = r"ps 0 would refuse its lease book \(manifest.json 'leases'\): lease state: "
WRONG_VALUES = {  # what is changed, and what the CheckpointError says
    "a consumed range past the data set": (lambda m: m["leases"]["epochs"][0].update(consumed=[[0, 90000]]),
                                           REFUSED + r"epoch 0 has a bad consumed range \[0, 90000\]"),
    "consumed ranges out of order": (lambda m: m["leases"]["epochs"][0].update(consumed=[[30, 40], [10, 20]]),
                                     REFUSED + r"epoch 0 has a bad consumed range \[10, 20\]"),
    "an epoch not yet opened": (lambda m: m["leases"]["epochs"][0].update(epoch=3),
                                REFUSED + "'epoch' must be an int from 0 to 0, got 3"),
    "a lease book of a newer version": (lambda m: m["leases"].update(version=2),
                                        REFUSED + "version must be 1, got 2"),
    "a step other than the directory's": (lambda m: m.update(step=90),
                                          "manifest.json says step 90, but the checkpoint's directory is "
                                          "ckpt-0000000020, not ckpt-0000000090"),
}


@pytest.mark.parametrize("change, says", WRONG_VALUES.values(), ids=WRONG_VALUES.keys())
def test_manifest_of_the_right_shape_with_wrong_values_is_refused_naming_them(tmp_path, change, says):
    path = _save_with_leases(tmp_path, 20)
    _rewrite_manifest(path, change)
    with pytest.raises(CheckpointError, match=says):
        read_checkpoint(path)


@pytest.mark.parametrize("change", [change for change, _ in WRONG_VALUES.values()], ids=WRONG_VALUES.keys())
def test_manifest_with_wrong_values_is_skipped_moved_aside_and_the_previous_one_used(tmp_path, caplog, change):
    _save_with_leases(tmp_path, 10)
    _rewrite_manifest(_save_with_leases(tmp_path, 20), change)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        restored = load_latest_checkpoint(tmp_path)
    assert restored.step == 10 and restored.leases == LEASES
    assert _damaged(tmp_path) == ["damaged-ckpt-0000000020"]
    assert "skipping damaged checkpoint" in caplog.text and "ckpt-0000000020" in caplog.text
    assert load_latest_checkpoint(tmp_path).step == 10  # and at the next start too (it was moved aside)


def test_pruning_moves_a_checkpoint_with_a_bad_lease_book_aside(tmp_path):
    _save_with_leases(tmp_path, 10)
    _rewrite_manifest(_save_with_leases(tmp_path, 20), lambda m: m["leases"].update(num_examples=0))
    _save(tmp_path, 30)  # pruning verifies 20 again: its manifest changed since it was written
    assert _damaged(tmp_path) == ["damaged-ckpt-0000000020"]
